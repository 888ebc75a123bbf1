// A strict policy (one pinned model name, a max-tokens cap) holds on every generation route of `keepwarm serve` and
// of `keepwarm proxy`: OpenAI chat and raw completions, Anthropic messages, Ollama chat, templated and raw generate.
// A model name the policy does not serve is refused with 404 before anything is generated, and the served name gets
// at most the cap, named in x-keepwarm-policy. Raw prompts go through the same policy call as chats.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, startProcess, curl, waitFor, tempDir } from './harness.mjs';

const cap = 3;
const dir = tempDir('policy-routes');
const policyFile = path.join(dir, 'policy.toml');
writeFileSync(policyFile, `
[model]
mode = "strict"

[options]
max_tokens_cap = ${cap}
`);

let serve;     // keepwarm serve with the policy
let upstream;  // keepwarm serve without one, behind the proxy
let proxy;     // keepwarm proxy with the policy, serving the same model name
before(async () => {
    [serve, upstream] = await Promise.all([
        startServer(['-c', '4096', '-np', '2', '--policy', policyFile]),
        startServer(['-c', '4096', '-np', '2']),
    ]);
    proxy = await startProcess(['proxy', '--port', '0', '--upstream', upstream.url, '--alias', 'tiny',
        '--policy', policyFile]);
    assert.ok(await waitFor(async () => (await curl(`${proxy.url}/health`)).status === 200), 'the upstream is up');
});
after(async () => Promise.all([serve?.stop(), proxy?.stop(), upstream?.stop()]));

const asked = 50;  // what each request asks for: more than the cap
const user = [{ role: 'user', content: 'Tell me a long story about the sea.' }];
// Each generation route: its path, its body for a model name, and the generated token count of its answer.
const routes = [
    {
        name: 'POST /v1/chat/completions',
        path: '/v1/chat/completions',
        body: (model) => ({ model, messages: user, max_tokens: asked, temperature: 0 }),
        generated: (body) => body.usage.completion_tokens,
    },
    {
        name: 'POST /v1/completions',
        path: '/v1/completions',
        body: (model) => ({ model, prompt: 'Once upon a time, by the sea,', max_tokens: asked, temperature: 0 }),
        generated: (body) => body.usage.completion_tokens,
    },
    {
        name: 'POST /v1/messages',
        path: '/v1/messages',
        body: (model) => ({ model, messages: user, max_tokens: asked, temperature: 0 }),
        generated: (body) => body.usage.output_tokens,
    },
    {
        name: 'POST /api/chat',
        path: '/api/chat',
        body: (model) => ({ model, messages: user, stream: false, options: { num_predict: asked, temperature: 0 } }),
        generated: (body) => body.eval_count,
    },
    {
        name: 'POST /api/generate',
        path: '/api/generate',
        body: (model) => ({ model, prompt: 'Tell me a long story about the sea.', stream: false,
            options: { num_predict: asked, temperature: 0 } }),
        generated: (body) => body.eval_count,
    },
    {
        name: 'POST /api/generate raw',
        path: '/api/generate',
        body: (model) => ({ model, prompt: 'Once upon a time, by the sea,', raw: true, stream: false,
            options: { num_predict: asked, temperature: 0 } }),
        generated: (body) => body.eval_count,
        proxy: 501,  // a raw prompt needs the local model's tokenizer: the proxy does not forward it
    },
];

async function post(url, body) {
    const response = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
        body: JSON.stringify(body),
    });
    const text = await response.text();
    let json;
    try {
        json = JSON.parse(text);
    } catch {
        json = text;
    }
    return { status: response.status, policy: response.headers.get('x-keepwarm-policy'), body: json };
}

const shown = (body) => JSON.stringify(body).slice(0, 300);

for (const command of ['serve', 'proxy']) {
    const url = () => (command === 'serve' ? serve : proxy).url;
    for (const route of routes) {
        test(`${command} ${route.name}: strict pinning refuses another model, the cap holds for the served one`,
            async () => {
                const refused = await post(`${url()}${route.path}`, route.body('gpt-4o'));
                assert.equal(refused.status, 404, shown(refused.body));
                assert.match(JSON.stringify(refused.body), /gpt-4o/, 'the error names the refused model');

                const r = await post(`${url()}${route.path}`, route.body('tiny'));
                if (command === 'proxy' && route.proxy) {
                    assert.equal(r.status, route.proxy, shown(r.body));
                    return;
                }
                assert.equal(r.status, 200, shown(r.body));
                assert.match(r.policy ?? '', new RegExp(`max-tokens-cap:${cap}`), 'x-keepwarm-policy names the cap');
                const generated = route.generated(r.body);
                assert.ok(generated >= 1 && generated <= cap, `${generated} tokens generated, cap ${cap}`);
            });
    }
}

test('serve: a streamed raw completion is capped too', async () => {
    const response = await fetch(`${serve.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', prompt: 'Once upon a time,', max_tokens: asked, stream: true,
            stream_options: { include_usage: true } }),
    });
    assert.equal(response.status, 200);
    assert.match(response.headers.get('x-keepwarm-policy') ?? '', new RegExp(`max-tokens-cap:${cap}`));
    const events = (await response.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
    const usage = events.map((e) => JSON.parse(e.slice(6))).find((chunk) => chunk.usage)?.usage;
    assert.ok(usage, 'a usage chunk');
    assert.ok(usage.completion_tokens <= cap, `${usage.completion_tokens} tokens generated, cap ${cap}`);
});
