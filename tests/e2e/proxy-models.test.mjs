// `keepwarm proxy` routes by model name: in front of two real `keepwarm serve` upstreams on loopback that serve
// different models (--alias alpha, --alias beta), each model's requests reach only the upstream that lists it, the
// proxy's /v1/models lists both and /v1/cache each upstream's models; a name no upstream lists (a client's label such
// as Claude Code's "claude-...") is answered as before, by whichever upstream routing picks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { testModel, curl, startProcess, tempDir } from './harness.mjs';

async function startUpstream(alias) {
    const model = await testModel('tiny');
    return startProcess(['serve', '-m', model, '--alias', alias, '--port', '0', '-t', '1', '-c', '4096', '-np', '2',
        '--cache-dir', tempDir('proxy-models-e2e')]);
}

function startProxy(upstreams) {
    return startProcess(['proxy', '--port', '0', ...upstreams.flatMap((u) => ['--upstream', u.url]),
        '--route-block', '64', '--health-interval', '0.2']);
}

let alpha, beta, proxy;
before(async () => {
    [alpha, beta] = [await startUpstream('alpha'), await startUpstream('beta')];
    proxy = await startProxy([alpha, beta]);
});
after(async () => {
    await proxy?.stop();
    await alpha?.stop();
    await beta?.stop();
});

async function ask(p, model, name) {
    const client = new OpenAI({ baseURL: `${p.url}/v1`, apiKey: 'none', maxRetries: 0 });
    const { data, response } = await client.chat.completions
        .create({
            model,
            messages: [{ role: 'system', content: `${name}: a terse assistant. `.repeat(8) },
                { role: 'user', content: `a question about ${name}` }],
            max_tokens: 2,
        })
        .withResponse();
    assert.equal(data.object, 'chat.completion');
    return response.headers.get('x-keepwarm-upstream');
}

test("each model's requests reach only the upstream that lists it", async () => {
    for (let i = 0; i < 3; i++) {
        assert.equal(await ask(proxy, 'alpha', `alpha-${i}`), alpha.url);
        assert.equal(await ask(proxy, 'beta', `beta-${i}`), beta.url);
    }
    const state = (await curl(`${proxy.url}/v1/cache`)).body;
    const byUrl = Object.fromEntries(state.upstreams.map((u) => [u.url, u]));
    assert.deepEqual(byUrl[alpha.url].models, ['alpha']);
    assert.deepEqual(byUrl[beta.url].models, ['beta']);
    assert.equal(byUrl[alpha.url].requests, 3);
    assert.equal(byUrl[beta.url].requests, 3);
});

test("the proxy's /v1/models lists every upstream's models", async () => {
    const res = await curl(`${proxy.url}/v1/models`);
    assert.equal(res.status, 200);
    const ids = res.body.data.map((m) => m.id);
    assert.ok(ids.includes('alpha') && ids.includes('beta'), `listed ${ids}`);
    assert.equal((await curl(`${proxy.url}/v1/models/beta`)).status, 200);
    assert.equal((await curl(`${proxy.url}/v1/models/gamma`)).status, 404);
});

test('a name no upstream lists is answered as before', async () => {
    const upstream = await ask(proxy, 'claude-sonnet-4-5', 'label-two');
    assert.ok([alpha.url, beta.url].includes(upstream), `answered by ${upstream}`);
    const single = await startProxy([alpha]);
    try {
        assert.equal(await ask(single, 'claude-sonnet-4-5', 'label-one'), alpha.url);
        assert.equal(await ask(single, 'alpha', 'named'), alpha.url);
    } finally {
        await single.stop();
    }
});
