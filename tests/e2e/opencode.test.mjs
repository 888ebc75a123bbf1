// The opencode CLI (opencode-ai, `opencode run`) against keepwarm through an OpenAI-compatible custom provider: two
// turns of one session (the second with --continue), each printing keepwarm's answer, the second reusing the first.
//
// A random-weight model never ends its turn by itself, so the provider's model entry carries, in opencode's own
// per-model `options` (sent in every request body), thinking off and OpenAI's structured output with a one-value enum:
// the grammar writes that JSON, then only an end of turn is allowed, and opencode ends the run on that stop. Everything
// else is opencode's real traffic: its system prompt, its ten tools with tool_choice auto, the title request of a new
// session, and streaming with usage. opencode runs with a HOME of its own and no network but keepwarm: no models.dev
// fetch, no autoupdate or sharing, a registry and proxy that lead nowhere, and its config folder's dependency
// (@opencode-ai/plugin, installed with npm at start-up when missing) declared present.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, tempDir } from './harness.mjs';
import { startCapture, streamedChat as streamed } from './capture-requests.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const opencode = path.join(here, 'node_modules/opencode-ai/bin/opencode.exe');
const version = JSON.parse(readFileSync(path.join(here, 'package.json'), 'utf8')).dependencies['opencode-ai'];
const answer = 'hello from keepwarm';

let home;
let work;
const started = [];
before(() => {
    home = tempDir('opencode-home');
    work = tempDir('opencode-work');
    // The global config folder's package.json, lock and node_modules: opencode adds @opencode-ai/plugin there with
    // npm when the lock does not list it.
    const config = path.join(home, '.config/opencode');
    mkdirSync(path.join(config, 'node_modules'), { recursive: true });
    mkdirSync(path.join(home, 'tmp'));
    const plugin = { '@opencode-ai/plugin': version };
    writeFileSync(path.join(config, 'package.json'), JSON.stringify({ dependencies: plugin }));
    writeFileSync(path.join(config, 'package-lock.json'),
                  JSON.stringify({ packages: { '': { dependencies: plugin } } }));
});
after(async () => {
    await Promise.all(started.map((s) => (s.stop ?? s.close)()));
});

// The provider, as a user would write it in opencode.json, plus the steering described above.
function config(baseUrl) {
    return {
        $schema: 'https://opencode.ai/config.json',
        autoupdate: false,
        share: 'disabled',
        model: 'keepwarm/tiny',
        provider: {
            keepwarm: {
                npm: '@ai-sdk/openai-compatible',
                name: 'keepwarm',
                options: { baseURL: `${baseUrl}/v1`, apiKey: 'none' },
                models: {
                    tiny: {
                        name: 'tiny',
                        // The grammar lets the model put whitespace between the JSON's tokens: room for it.
                        limit: { context: 16384, output: 256 },
                        // Thinking off: the template thinks by default, and a random model may think until the limit.
                        options: { chat_template_kwargs: { enable_thinking: false },
                            response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true,
                            schema: { type: 'object', properties: { answer: { type: 'string', enum: [answer] } },
                                      required: ['answer'], additionalProperties: false } } } },
                    },
                },
            },
        },
    };
}

// Runs `opencode run ...ARGS` with only the environment it needs.
function runOpencode(baseUrl, args) {
    const configFile = path.join(home, 'keepwarm-opencode.json');
    writeFileSync(configFile, JSON.stringify(config(baseUrl)));
    const nowhere = 'http://127.0.0.1:9';
    const env = {
        PATH: process.env.PATH,
        HOME: home,
        XDG_CONFIG_HOME: path.join(home, '.config'),
        XDG_DATA_HOME: path.join(home, '.local/share'),
        XDG_CACHE_HOME: path.join(home, '.cache'),
        XDG_STATE_HOME: path.join(home, '.local/state'),
        // Bun extracts the binary's native libraries (OpenTUI's, 5.5 MB) there and never removes them.
        TMPDIR: path.join(home, 'tmp'),
        OPENCODE_CONFIG: configFile,
        OPENCODE_DISABLE_AUTOUPDATE: '1',
        OPENCODE_DISABLE_MODELS_FETCH: '1',
        OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
        OPENCODE_DISABLE_SHARE: '1',
        OPENCODE_DISABLE_DEFAULT_PLUGINS: '1',
        OPENCODE_DISABLE_CLAUDE_CODE: '1',
        HTTP_PROXY: nowhere,
        HTTPS_PROXY: nowhere,
        NO_PROXY: '127.0.0.1,localhost',
        npm_config_registry: `${nowhere}/`,
    };
    return new Promise((resolve) => {
        const child = execFile(opencode, ['run', ...args], { env, cwd: work, timeout: 120_000 },
            (error, stdout, stderr) => resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr }));
        child.stdin.end();
    });
}

test('opencode run: two turns of one session print the answers, the second reuses the first', async () => {
    const server = await startServer(['-c', '16384', '--parallel', '1']);
    started.push(server);
    const capture = await startCapture(server.url);
    started.push(capture);

    const turn = async (args) => {
        const from = capture.requests.length;
        const run = await runOpencode(capture.url, args);
        assert.equal(run.code, 0, `opencode exited ${run.code}\nstdout: ${run.stdout}\nstderr: ${run.stderr}`);
        const sent = capture.requests.slice(from);
        // Every answer that ended was a 200 (opencode may leave the session's title request unfinished when the turn
        // is over).
        for (const r of sent.filter((r) => r.response)) {
            assert.equal(r.response.status, 200, `${r.path}: ${r.response.body}`);
        }
        // The turn itself: the request with opencode's tools (the title request has none).
        const main = sent.filter((r) => r.path === '/v1/chat/completions' && r.body.tools?.length);
        assert.equal(main.length, 1, JSON.stringify(sent.map((r) => `${r.method} ${r.path}`)));
        const answered = streamed(main[0].response.body);
        assert.equal(answered.finish, 'stop', `${JSON.stringify(answered)}\n${main[0].response.body.slice(-3000)}`);
        assert.deepEqual(JSON.parse(answered.text), { answer }, answered.text);
        assert.ok(run.stdout.includes(answered.text.trim()),
                  `opencode printed:\n${run.stdout}\nkeepwarm answered:\n${answered.text}`);
        return { run, sent, body: main[0].body, usage: answered.usage };
    };

    const one = await turn(['Say hello']);
    // opencode's real traffic: its user agent, tools offered with tool_choice auto, a streamed answer with usage.
    assert.ok(one.sent[0].headers['user-agent'].startsWith(`opencode/${version} `), one.sent[0].headers['user-agent']);
    assert.equal(one.body.tool_choice, 'auto');
    assert.ok(one.body.tools.some((t) => t.function.name === 'bash'),
              JSON.stringify(one.body.tools.map((t) => t.function.name)));
    assert.deepEqual(one.body.stream_options, { include_usage: true });
    assert.ok(one.sent.some((r) => !r.body.tools && JSON.stringify(r.body.messages).includes('title')),
              'a new session asks for its title');

    const two = await turn(['--continue', 'Say it again']);
    // The same system prompt and tools, the first turn's question and answer, then the new question.
    assert.deepEqual(two.body.messages.slice(0, one.body.messages.length), one.body.messages);
    const [reply, question] = two.body.messages.slice(one.body.messages.length);
    assert.equal(reply.role, 'assistant');
    assert.deepEqual(JSON.parse(reply.content), { answer });
    assert.equal(question.role, 'user');
    assert.match(JSON.stringify(question.content), /Say it again/);
    assert.deepEqual(two.body.tools, one.body.tools);

    // The first turn computed opencode's prompt (~7K tokens); the second read all of it from keepwarm's cache but
    // the end of its generation prompt: with thinking off, Qwen3's template opens the answer with an empty think
    // block that it leaves out when the answer is history (6 tokens).
    const first = one.usage;
    const second = two.usage;
    assert.ok(first.prompt_tokens > 5000, JSON.stringify(first));
    assert.ok(first.prompt_tokens_details.cached_tokens < first.prompt_tokens / 2, JSON.stringify(first));
    assert.ok(second.prompt_tokens > first.prompt_tokens, JSON.stringify([first, second]));
    assert.ok(second.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 16,
              `cached ${second.prompt_tokens_details.cached_tokens} of ${second.prompt_tokens}; ` +
              `the first turn's prompt: ${first.prompt_tokens}`);
});
