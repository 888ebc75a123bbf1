// The Codex CLI (@openai/codex, `codex exec`) against keepwarm through a custom provider speaking the Responses API:
// one task with a tool round trip (a shell command called, run by Codex, its output sent back) and a final answer,
// and the second request reusing the first's prefix; against `keepwarm serve`, and through `keepwarm proxy` in front
// of one.
//
// A random-weight model never calls a tool or ends a turn by itself, so a recording proxy between Codex and keepwarm
// steers each request as the Claude Code test does through its extra body: the model is offered Codex's exec_command
// alone, allowing one command; the first turn must call it (tool_choice required), and the turn after the tool output
// writes one allowed JSON answer (text.format), after which only an end of turn is allowed. Everything else is Codex's
// real traffic: its instructions, history items, prompt_cache_key, and the streamed events it reads back. (What
// keepwarm does with the tools Codex also sends, web_search and a namespace, is in test-responses-api.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { curl, metrics, startProcess, startServer, waitFor, tempDir } from './harness.mjs';
import { startCapture } from './capture-requests.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const codex = path.join(here, 'node_modules/@openai/codex/bin/codex.js');
const command = 'echo keepwarm-e2e';
const answer = 'done';

let home;
let work;
const started = [];
before(() => {
    home = tempDir('codex-home');
    work = tempDir('codex-work');
});
after(async () => {
    await Promise.all(started.map((s) => (s.stop ?? s.close)()));
});

// The steering described above. Both turns get the same tool list (exec_command alone, allowing the one command), so
// the prompt up to the history is the same and its reuse is measured, not the steering's.
function steer(body, url) {
    if (!url.endsWith('/responses') || !Array.isArray(body.input)) return body;
    const last = body.input.at(-1);
    body.reasoning = { effort: 'none' };
    body.tools = (body.tools ?? []).filter((t) => t.type === 'function' && t.name === 'exec_command').map((t) => ({
        ...t, parameters: { type: 'object', properties: { cmd: { type: 'string', enum: [command] } },
            required: ['cmd'], additionalProperties: false } }));
    if (last?.type === 'function_call_output') {
        body.tool_choice = 'none';
        body.text = { format: { type: 'json_schema', name: 'answer', strict: true, schema: {
            type: 'object', properties: { answer: { type: 'string', enum: [answer] } }, required: ['answer'],
            additionalProperties: false } } };
    } else {
        body.tool_choice = 'required';
        body.parallel_tool_calls = false;
    }
    return body;
}

// Runs `codex exec PROMPT` with a provider of its own (no OpenAI account, no network but the proxy).
function runCodex(baseUrl, prompt) {
    const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: home, RUST_LOG: 'error' };
    const args = ['exec', '--skip-git-repo-check', '--dangerously-bypass-approvals-and-sandbox',
        '-c', 'model_provider=keepwarm',
        '-c', `model_providers.keepwarm={name="keepwarm", base_url="${baseUrl}/v1", wire_api="responses"}`,
        '-m', 'tiny', prompt];
    return new Promise((resolve) => {
        const child = execFile(process.execPath, [codex, ...args], { env, cwd: work, timeout: 300_000 },
            (error, stdout, stderr) => resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
        child.stdin.end();  // codex exec reads more of the prompt from a stdin that is not a terminal, until its end
    });
}

// The final response object of a streamed answer, from its SSE text.
function finalResponse(sse) {
    for (const block of sse.split('\n\n').reverse()) {
        const data = block.split('\n').find((line) => line.startsWith('data: '));
        if (!data) continue;
        const event = JSON.parse(data.slice(6));
        if (event.type === 'response.completed' || event.type === 'response.incomplete') return event.response;
    }
    return null;
}

// Runs the task through the steering proxy in front of `target` (keepwarm serve, or a proxy in front of it) and checks
// the round trip: the call out, Codex running it, its output back, the answer printed, the second request reusing the
// first's prefix. Returns the two requests' final responses.
async function roundTrip(target) {
    const capture = await startCapture(target, { rewrite: steer });
    started.push(capture);

    const r = await runCodex(capture.url, 'Print the word keepwarm-e2e with a shell command.');
    const sent = capture.requests.filter((q) => q.method === 'POST' && q.path.endsWith('/responses'));
    assert.equal(r.code, 0, `codex exit ${r.code}\n${r.stdout}\n${r.stderr}`);
    assert.ok(sent.length >= 2, `requests: ${sent.map((q) => q.path).join(', ')}`);

    // What Codex sent is its real traffic: instructions, its tools, the prompt cache key.
    const first = sent[0].body;
    assert.ok(first.tools.some((t) => t.type === 'function' && t.name === 'exec_command'));
    assert.ok(typeof first.prompt_cache_key === 'string');

    // The call went out, Codex ran it, and the output came back in the next request.
    const outputs = sent[1].body.input.filter((item) => item.type === 'function_call_output');
    // One call, as parallel_tool_calls false asks (the pinned llama.cpp's grammar for Qwen3's calls would repeat it
    // at Codex's default temperature; keepwarm ends the answer at the first call).
    assert.equal(outputs.length, 1, JSON.stringify(sent[1].body.input.slice(-3)));
    const output = outputs[0].output;
    assert.match(typeof output === 'string' ? output : JSON.stringify(output), /keepwarm-e2e/);
    assert.ok(sent[1].body.input.some((item) => item.type === 'function_call' && item.name === 'exec_command'));

    // The answer Codex printed, and the second request's reuse of the first. Codex exits at response.completed,
    // which can be before the stream's end has passed through the capture (through the proxy, it was, once).
    assert.match(r.stdout, new RegExp(`"answer"\\s*:\\s*"${answer}"`), r.stdout);
    assert.ok(await waitFor(() => sent[0].response && sent[1].response, { timeoutMs: 60_000 }), 'the answers ended');
    const one = finalResponse(sent[0].response.body);
    const two = finalResponse(sent[1].response.body);
    assert.equal(one.status, 'completed');
    assert.equal(two.status, 'completed');
    assert.ok(two.usage.input_tokens > one.usage.input_tokens);
    assert.ok(two.usage.input_tokens_details.cached_tokens >= one.usage.input_tokens - 12,
        `cached ${two.usage.input_tokens_details.cached_tokens} of the first request's ${one.usage.input_tokens}`);
    return [one, two];
}

test('codex exec runs a tool round trip against keepwarm, and its second request reuses the first', async () => {
    const server = await startServer(['-c', '32768', '--parallel', '1']);
    started.push(server);
    await roundTrip(server.url);
});

// The same through `keepwarm proxy` in front of `keepwarm serve`: the proxy serves the Responses API, routes both
// requests to the upstream (the second by its prefix) and passes the upstream's usage through.
test('codex exec runs the same round trip through keepwarm proxy', async () => {
    const server = await startServer(['-c', '32768', '--parallel', '1']);
    started.push(server);
    const proxy = await startProcess(['proxy', '--port', '0', '--upstream', server.url]);
    started.push(proxy);
    const [one, two] = await roundTrip(proxy.url);

    const { body: state } = await curl(`${proxy.url}/v1/cache`);
    assert.equal(state.upstreams.length, 1);
    assert.ok(state.upstreams[0].requests >= 2, JSON.stringify(state.upstreams[0]));
    assert.ok(state.upstreams[0].prefix_hits >= 1, 'the proxy routed the second request by the first one\'s prefix');
    // The reuse reported through the proxy is the upstream's own.
    const upstream = await metrics(server.url);
    assert.ok(upstream.keepwarm_requests_total >= 2);
    assert.ok(upstream.keepwarm_reused_tokens_total >= two.usage.input_tokens_details.cached_tokens,
        JSON.stringify(upstream));
    assert.ok(upstream.keepwarm_prompt_tokens_total >= one.usage.input_tokens + two.usage.input_tokens);
});
