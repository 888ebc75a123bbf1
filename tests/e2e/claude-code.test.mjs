// The Claude Code CLI (@anthropic-ai/claude-code, print mode) against keepwarm: one turn, two turns of one session
// (the second reusing the first), a tool round trip; and the requests it was seen to send (tests/fixtures/claude-code/)
// replayed through /v1/messages.
//
// A random-weight model never ends its turn by itself, and Claude Code treats a max_tokens stop as an error. So the
// run asks, through Claude Code's own CLAUDE_CODE_EXTRA_BODY (merged into every request body), for Anthropic's
// structured output with a one-value enum: the grammar writes that JSON, then only an end of turn is allowed. It also
// turns thinking off (Claude Code asks for adaptive thinking, and a random model would think until max_tokens).
// Everything else is Claude Code's real traffic: its system blocks, tools, betas, x-api-key, and streaming.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, tempDir } from './harness.mjs';
import { startCapture } from './capture-requests.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const claude = path.join(here, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const fixturesDir = path.join(here, '../fixtures/claude-code');
// The version tests/e2e/package.json pins, as Claude Code writes it in its user agent and billing header.
const version = JSON.parse(readFileSync(path.join(here, 'package.json'), 'utf8'))
    .dependencies['@anthropic-ai/claude-code'];
const versionPattern = version.replaceAll('.', '\\.');

const answer = 'hello from keepwarm';
const schema = {
    type: 'object',
    properties: { answer: { type: 'string', enum: [answer] } },
    required: ['answer'],
    additionalProperties: false,
};

let home;
before(() => {
    home = tempDir('claude-home');
});

// Runs `claude -p PROMPT` with only the environment it needs (no user config, no network but keepwarm).
function runClaude(baseUrl, apiKey, prompt, args = [], overrides = {}) {
    const env = {
        PATH: process.env.PATH,
        HOME: home,
        ANTHROPIC_BASE_URL: baseUrl,
        ANTHROPIC_API_KEY: apiKey,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
        DISABLE_TELEMETRY: '1',
        DISABLE_AUTOUPDATER: '1',
        DISABLE_ERROR_REPORTING: '1',
        // The grammar lets the random model put whitespace between the JSON's tokens (a bounded amount): room for it.
        CLAUDE_CODE_MAX_OUTPUT_TOKENS: '256',
        CLAUDE_CODE_EXTRA_BODY: JSON.stringify({
            thinking: { type: 'disabled' },
            output_config: { format: { type: 'json_schema', schema } },
        }),
        ...overrides,
    };
    return new Promise((resolve) => {
        execFile(claude, ['-p', prompt, ...args], { env, cwd: home, timeout: 180_000 }, (error, stdout, stderr) =>
            resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
    });
}

// keepwarm_requests_total from /metrics (which this server guards with its API key).
async function generations(server, apiKey) {
    const res = await fetch(`${server.url}/metrics`, { headers: { authorization: `Bearer ${apiKey}` } });
    return Number((await res.text()).match(/^keepwarm_requests_total (\d+)$/m)[1]);
}

// The text of a streamed Anthropic answer, from its text_delta events.
function streamedText(sse) {
    let text = '';
    for (const frame of sse.split('\n\n')) {
        const data = frame.split('\n').find((line) => line.startsWith('data: '));
        if (!data) continue;
        const event = JSON.parse(data.slice(6));
        if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
    }
    return text;
}

test('Claude Code in print mode prints the answer keepwarm streamed', async () => {
    const server = await startServer(['-c', '8192', '--parallel', '1', '--api-key', 'cc-test-key']);
    const capture = await startCapture(server.url);
    try {
        const before = await generations(server, 'cc-test-key');
        const run = await runClaude(capture.url, 'cc-test-key', 'Say hello', ['--model', 'tiny', '--tools', 'Read']);
        assert.equal(run.code, 0, `claude exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);

        const messages = capture.requests.filter((r) => r.path.startsWith('/v1/messages'));
        assert.ok(messages.length >= 1, JSON.stringify(capture.requests.map((r) => `${r.method} ${r.path}`)));
        for (const r of messages) assert.equal(r.response?.status, 200, r.response?.body);
        assert.equal(await generations(server, 'cc-test-key') - before, messages.length,
                     'every request Claude Code made was a generation keepwarm served');

        const main = messages.at(-1);
        assert.match(main.headers['user-agent'], new RegExp(`^claude-cli/${versionPattern} `));
        assert.equal(main.body.stream, true);
        // --tools Read: Read, and a placeholder Claude Code marks defer_loading (it keeps its tool search active).
        assert.deepEqual(main.body.tools.filter((t) => !t.defer_loading).map((t) => t.name), ['Read']);
        assert.match(main.body.system[0].text,
                     new RegExp(`^x-anthropic-billing-header: cc_version=${versionPattern}\\.[0-9a-f]{3};`));
        const text = streamedText(main.response.body);
        assert.ok(text.includes(answer), text);
        assert.equal(run.stdout.trim(), text.trim(), 'Claude Code printed what keepwarm answered');
    } finally {
        await capture.close();
        await server.stop();
    }
});

// The usage keepwarm gave in a streamed Anthropic answer's message_delta (the final split of the prompt).
function streamedUsage(sse) {
    for (const frame of sse.split('\n\n')) {
        const data = frame.split('\n').find((line) => line.startsWith('data: '));
        if (data?.includes('"message_delta"')) return JSON.parse(data.slice(6)).usage;
    }
    return null;
}

// Two turns of one session: the second `claude -p --resume ID` sends the first turn again (its system blocks, tools,
// the question and keepwarm's answer) with a new question; keepwarm reads the first turn's prompt from its cache.
test('Claude Code resumes a session: both turns print the answer, the second reuses the first', async () => {
    const server = await startServer(['-c', '8192', '--parallel', '1', '--api-key', 'cc-test-key']);
    const capture = await startCapture(server.url);
    const session = randomUUID();
    const turn = async (prompt, args) => {
        const from = capture.requests.length;
        const run = await runClaude(capture.url, 'cc-test-key', prompt,
                                    ['--model', 'tiny', '--tools', 'Read', ...args]);
        assert.equal(run.code, 0, `claude exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);
        // The turn's own request: the one with Claude Code's tools (a title request, when sent, has none).
        const main = capture.requests.slice(from)
            .filter((r) => r.path.startsWith('/v1/messages') && r.body?.tools?.length).at(-1);
        assert.ok(main, JSON.stringify(capture.requests.slice(from).map((r) => `${r.method} ${r.path}`)));
        assert.equal(main.response?.status, 200, main.response?.body);
        const text = streamedText(main.response.body);
        assert.deepEqual(JSON.parse(text), { answer }, text);
        assert.equal(run.stdout.trim(), text.trim(), 'Claude Code printed what keepwarm answered');
        return { main, usage: streamedUsage(main.response.body) };
    };
    try {
        const one = await turn('Say hello', ['--session-id', session]);
        const two = await turn('Say it again', ['--resume', session]);

        // The second turn is the first one's conversation with the answer and a new question after it.
        const messages = two.main.body.messages;
        assert.equal(messages.length, one.main.body.messages.length + 2, JSON.stringify(messages).slice(0, 3000));
        assert.deepEqual(messages.map((m) => m.role),
                         [...one.main.body.messages.map((m) => m.role), 'assistant', 'user']);
        assert.ok(JSON.stringify(messages.at(-2).content).includes(answer), JSON.stringify(messages.at(-2)));
        assert.ok(JSON.stringify(messages.at(-1).content).includes('Say it again'), JSON.stringify(messages.at(-1)));
        assert.equal(JSON.stringify(two.main.body.system), JSON.stringify(one.main.body.system));
        assert.equal(JSON.stringify(two.main.body.tools), JSON.stringify(one.main.body.tools));

        // keepwarm computed the first turn's prompt once: the second read it from the cache.
        assert.ok(one.usage.cache_read_input_tokens < prompt(one.usage) / 2, JSON.stringify(one.usage));
        assert.ok(prompt(two.usage) > prompt(one.usage), JSON.stringify([one.usage, two.usage]));
        assert.ok(two.usage.cache_read_input_tokens >= prompt(one.usage) - 16,
                  `second turn: ${JSON.stringify(two.usage)}; the first turn's prompt: ${prompt(one.usage)}`);
    } finally {
        await capture.close();
        await server.stop();
    }
});

// A tool round trip: Claude Code asks for its Read tool through CLAUDE_CODE_EXTRA_BODY's tool_choice, keepwarm starts
// the answer with the template's tool-call marker (as Anthropic does for tool_choice tool/any) and the grammar writes a
// Read call with a random path; Claude Code runs it (the file does not exist), and sends the tool_result back with
// the tool_use id keepwarm gave. Every turn is forced to call Read, so --max-turns ends the run. The random model
// would write a path until max_tokens, so a policy file biases this client towards '"' (which the grammar admits
// only to end a string) and the end of the turn, and samples greedily (with sampling, a long string now and then ran
// into max_tokens under load): a per-client forced logit bias and temperature, as an operator would write them.
// The template's grammar lets calls follow one another, and the random model wrote 5 to 7 of them, each padded with
// the whitespace the grammar allows (115-230 tokens; the prompt holds the random home folder, so it differs per run,
// and in one CI run the calls reached max_tokens): disable_parallel_tool_use asks for one call, as a client may.
test('Claude Code completes a tool round trip: tool_use out, tool_result back with its id', async () => {
    const policy = path.join(home, 'short-strings.toml');
    writeFileSync(policy, '[[client]]\nclient = "claude-cli"\ntemperature = 0\n' +
        `logit_bias = { '"' = 12, "<|im_end|>" = 12 }\n`);
    const server = await startServer(['-c', '8192', '--parallel', '1', '--api-key', 'cc-test-key', '--policy', policy]);
    const capture = await startCapture(server.url);
    try {
        const run = await runClaude(capture.url, 'cc-test-key', 'Read the file notes.txt',
            ['--model', 'tiny', '--tools', 'Read', '--max-turns', '2', '--output-format', 'json'], {
                CLAUDE_CODE_MAX_OUTPUT_TOKENS: '512',
                CLAUDE_CODE_EXTRA_BODY: JSON.stringify({
                    thinking: { type: 'disabled' },
                    tool_choice: { type: 'tool', name: 'Read', disable_parallel_tool_use: true },
                }),
            });
        const turns = capture.requests.filter((r) => r.path.startsWith('/v1/messages') && r.body?.tools?.length);
        assert.ok(turns.length >= 2, `claude exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}\n` +
                  JSON.stringify(capture.requests.map((r) => [r.path, r.response?.status, r.response?.body?.slice(0, 300)])));
        for (const r of turns) assert.equal(r.response?.status, 200, r.response?.body);

        // keepwarm's answer to the first turn: one tool_use block for Read, streamed with Anthropic's events.
        const events = turns[0].response.body.split('\n\n').map((frame) => frame.split('\n')
            .find((line) => line.startsWith('data: '))).filter(Boolean).map((line) => JSON.parse(line.slice(6)));
        const toolStart = events.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
        assert.ok(toolStart, turns[0].response.body.slice(0, 2000));
        assert.equal(toolStart.content_block.name, 'Read');
        assert.equal(events.filter((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use')
            .length, 1, 'disable_parallel_tool_use: one call');
        assert.match(toolStart.content_block.id, /^toolu_/);
        assert.equal(events.find((e) => e.type === 'message_delta').delta.stop_reason, 'tool_use');

        // Claude Code's next turn carries the call and its result, under the id keepwarm gave.
        const next = turns[1].body.messages;
        const call = next.flatMap((m) => (m.role === 'assistant' && Array.isArray(m.content) ? m.content : []))
            .find((b) => b.type === 'tool_use');
        assert.equal(call?.id, toolStart.content_block.id, JSON.stringify(next));
        const result = next.flatMap((m) => (m.role === 'user' && Array.isArray(m.content) ? m.content : []))
            .find((b) => b.type === 'tool_result');
        assert.equal(result?.tool_use_id, toolStart.content_block.id, JSON.stringify(next));
        // The second turn reuses the first: the prefix cache held Claude Code's whole first prompt.
        const usage = JSON.parse(turns[1].response.body.split('\n\n').map((f) => f.split('\n')
            .find((l) => l.startsWith('data: '))).filter(Boolean).map((l) => l.slice(6))
            .find((d) => d.includes('"message_delta"'))).usage;
        assert.ok(usage.cache_read_input_tokens > 1000, JSON.stringify(usage));
    } finally {
        await capture.close();
        await server.stop();
    }
});

// Claude Code's first-party mode (_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL=1, as against Anthropic's own API) writes a
// billing header with a per-request nonce, prompt id and turn counters (cch, cc_prompt_id, cc_turn_index, ...) at the
// very start of the system prompt. keepwarm's built-in policy keeps every one of them out of the prompt, so each turn
// reuses all of the previous turn's prompt (before, 33 of ~11,640 tokens).
const prompt = (u) => u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens;
const firstPartyEnv = { _CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL: '1' };

test('Claude Code in first-party mode: each of three turns reuses at least 99% of the previous prompt', async (t) => {
    const server = await startServer(['-c', '16384', '--parallel', '1', '--api-key', 'cc-test-key']);
    const capture = await startCapture(server.url);
    const session = randomUUID();
    const turn = async (question, args) => {
        const from = capture.requests.length;
        const run = await runClaude(capture.url, 'cc-test-key', question,
                                    ['--model', 'tiny', '--tools', 'Read', ...args], firstPartyEnv);
        assert.equal(run.code, 0, `claude exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);
        const main = capture.requests.slice(from)
            .filter((r) => r.path.startsWith('/v1/messages') && r.body?.tools?.length).at(-1);
        assert.ok(main, JSON.stringify(capture.requests.slice(from).map((r) => `${r.method} ${r.path}`)));
        assert.equal(main.response?.status, 200, main.response?.body);
        assert.match(main.body.system[0].text, /^x-anthropic-billing-header: cc_version=.*; cch=[0-9a-f]{5}; cc_prompt_id=/);
        return { main, usage: streamedUsage(main.response.body) };
    };
    try {
        const turns = [await turn('Say hello', ['--session-id', session])];
        turns.push(await turn('Say it again', ['--resume', session]));
        turns.push(await turn('And once more', ['--resume', session]));
        t.diagnostic(`usage per turn: ${JSON.stringify(turns.map((x) => x.usage))}`);
        // The header really changed from turn to turn (the nonce, the prompt id, the turn index) ...
        assert.notEqual(turns[1].main.body.system[0].text, turns[0].main.body.system[0].text);
        for (let i = 1; i < turns.length; i++) {
            const previous = prompt(turns[i - 1].usage), now = turns[i].usage;
            // ... and yet the cache gave back the previous turn's prompt.
            assert.ok(now.cache_read_input_tokens >= 0.99 * previous,
                      `turn ${i + 1} reused ${now.cache_read_input_tokens} of the previous ${previous}: ` +
                      JSON.stringify(turns.map((t) => t.usage)));
        }
    } finally {
        await capture.close();
        await server.stop();
    }
});

// The same on the captured first-party turns (tests/fixtures/claude-code/first-party-turn-*.json, see the README):
// with the built-in defaults each turn reuses the previous prompt; without a policy it reuses only what comes before
// the nonce.
async function replayTurns(server, names) {
    const usages = [];
    for (const name of names) {
        const f = JSON.parse(readFileSync(path.join(fixturesDir, name), 'utf8'));
        const res = await fetch(`${server.url}${f.path}`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'anthropic-version': f.headers['anthropic-version'] },
            body: JSON.stringify({ ...f.body, max_tokens: 4 }),
            signal: AbortSignal.timeout(600_000),
        });
        const body = await res.text();
        assert.equal(res.status, 200, `${name}: ${body}`);
        usages.push(streamedUsage(body));
    }
    return usages;
}

test('captured first-party turns reuse the previous prompt with the defaults, not without a policy', async (t) => {
    const names = ['first-party-turn-1.json', 'first-party-turn-2.json', 'first-party-turn-3.json'];
    for (const [args, reuses] of [[[], true], [['--no-policy'], false]]) {
        const server = await startServer(['-c', '16384', '--parallel', '1', ...args]);
        try {
            const usages = await replayTurns(server, names);
            t.diagnostic(`${args.join(' ') || 'defaults'}: ${JSON.stringify(usages)}`);
            for (let i = 1; i < usages.length; i++) {
                const ok = usages[i].cache_read_input_tokens >= 0.99 * prompt(usages[i - 1]);
                assert.equal(ok, reuses, `${args.join(' ') || 'defaults'}: ${JSON.stringify(usages)}`);
            }
        } finally {
            await server.stop();
        }
    }
});

// Each fixture is one request as Claude Code 2.1.197 sent it (see the README beside them): the title request, the
// main turn with its 25 tools (about 21K tokens), and the turn it sends after a max_tokens stop.
test('captured Claude Code requests are served', async () => {
    const fixtures = readdirSync(fixturesDir).filter((f) => f.endsWith('.json'))
        .map((f) => ({ name: f, ...JSON.parse(readFileSync(path.join(fixturesDir, f), 'utf8')) }));
    const replayed = fixtures.filter((f) => f.method === 'POST' && f.path.startsWith('/v1/messages') &&
                                     !f.name.startsWith('first-party-'));  // replayed as turns above
    assert.ok(replayed.length >= 3, fixtures.map((f) => f.name).join(', '));
    const server = await startServer(['-c', '32768', '--parallel', '1']);
    try {
        for (const f of fixtures.filter((f) => f.method === 'HEAD')) {
            const res = await fetch(`${server.url}${f.path}`, { method: 'HEAD' });
            assert.ok(res.status < 500, `${f.name}: ${res.status}`);
        }
        for (const f of replayed) {
            const res = await fetch(`${server.url}${f.path}`, {
                method: 'POST',
                headers: { 'content-type': 'application/json', 'anthropic-version': f.headers['anthropic-version'],
                           'anthropic-beta': f.headers['anthropic-beta'] },
                body: JSON.stringify(f.body),
                signal: AbortSignal.timeout(600_000),
            });
            const body = await res.text();
            assert.equal(res.status, 200, `${f.name}: ${body}`);
            assert.ok(body.includes('event: message_stop'), `${f.name}: ${body.slice(-500)}`);
        }
    } finally {
        await server.stop();
    }
});
