// Cache-buster detection on the real server with the official openai client: two requests whose system prompts
// differ only by a `request-id: <uuid>` near the start show up in GET /v1/cache/busters (client, span, position,
// cost, suggested rule) and in the log.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID, randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, curl, tempDir } from './harness.mjs';

// Auto mode: random ids become span rules by themselves. The built-in uuid and timestamp rules are off so that ids
// and a changing clock reach the detector.
const dir = tempDir('busters');
const autoPolicy = path.join(dir, 'auto.toml');
writeFileSync(autoPolicy, '[detect]\nmode = "auto"\n[spans]\nuuid = false\ntimestamp = false\n');
const offPolicy = path.join(dir, 'off.toml');
writeFileSync(offPolicy, '[detect]\nmode = "off"\n');
// Report mode, with the built-in uuid and timestamp rules off so that the ids and clocks reach the detector.
const reportPolicy = path.join(dir, 'report.toml');
writeFileSync(reportPolicy, '[detect]\nmode = "report"\n[spans]\nuuid = false\ntimestamp = false\n');

let server, auto;
before(async () => {
    // --log-prompts: the log lines checked here quote the span (without it they do not, see tenants.test.mjs).
    [server, auto] = await Promise.all([startServer(['-c', '4096', '--log-prompts', '--policy', reportPolicy]),
                                        startServer(['-c', '4096', '--policy', autoPolicy])]);
});
after(async () => Promise.all([server?.stop(), auto?.stop()]));

// A system prompt of ~2,500 chars (several hundred tokens) with a per-request id in its second line.
function systemPrompt(requestId, key = 'request-id') {
    const rules = [];
    for (let i = 1; i <= 40; i++) rules.push(`${i}. Read the relevant files before you change rule ${i}; keep edits small.`);
    return `You are a coding agent.\n${key}: ${requestId}\n${rules.join('\n')}`;
}

const ask = (openai, messages) =>
    openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, temperature: 0 });

test('a per-request uuid in the system prompt is reported with its client, position, cost and rule', async () => {
    const openai = server.client();
    // Ids that differ from their first character: two random ones that share a first token or two let the cache
    // match into the span, past the bound below (it failed so once, "cached 15, span at token 13").
    const first = randomUUID();
    let second = randomUUID();
    while (second[0] === first[0]) second = randomUUID();
    const user = { role: 'user', content: 'List the files.' };
    await ask(openai, [{ role: 'system', content: systemPrompt(first) }, user]);
    const busted = await ask(openai, [{ role: 'system', content: systemPrompt(second) }, user]);

    const { status, body } = await curl(`${server.url}/v1/cache/busters`);
    assert.equal(status, 200);
    assert.equal(body.reports.length, 1, JSON.stringify(body));
    const r = body.reports[0];
    assert.equal(r.client, 'OpenAI');  // the openai package's User-Agent: "OpenAI/JS <version>"
    assert.equal(r.api, 'openai');
    assert.match(r.request_id, /^chatcmpl-/);
    assert.equal(r.kind, 'uuid');
    assert.equal(r.random_id, true);
    assert.equal(r.span.previous, first);
    assert.equal(r.span.current, second);
    assert.equal(r.span.message_index, 0);
    assert.equal(r.span.role, 'system');
    assert.ok(r.span.context_before.endsWith('request-id: '), r.span.context_before);
    assert.ok(r.span.token_offset > 0 && r.span.token_offset < 30, `token ${r.span.token_offset}: near the start`);
    // The cache stopped at the span; every prompt token from it on was computed because of it.
    const cached = busted.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached <= r.span.token_offset + 1, `cached ${cached}, span at token ${r.span.token_offset}`);
    assert.equal(r.prompt_tokens, busted.usage.prompt_tokens);
    assert.equal(r.reused_tokens, cached);
    // From the span on, less what the cache still matched inside it (two uuids can share their first characters).
    assert.equal(r.cost_tokens, busted.usage.prompt_tokens - Math.max(r.span.token_offset, cached));
    assert.ok(r.cost_tokens > 300, `cost ${r.cost_tokens}`);
    assert.equal(r.rule.pattern, 'request-id: [0-9a-f-]{36}');
    assert.equal(r.rule.action, 'replace');
    assert.equal(r.rule.replacement, 'request-id: 00000000-0000-0000-0000-000000000000');
    assert.deepEqual(body.counts.map((c) => [c.client, c.pattern, c.count, c.cost_tokens]),
                     [['OpenAI', 'request-id: [0-9a-f-]{36}', 1, r.cost_tokens]]);

    const log = server.output();
    assert.match(log, new RegExp(`cache buster from client OpenAI at token ${r.span.token_offset}: uuid "${second}" ` +
                                 `where the previous prompt had "${first}" .* costs ${r.cost_tokens} tokens; ` +
                                 `suggested rule: \\[\\[spans\\.rule\\]\\] name = 'request-id-uuid'`));
});

test('a conversation that goes on, and another client, add no report', async () => {
    const openai = server.client();
    const id = randomUUID();
    const turn1 = [{ role: 'system', content: systemPrompt(id) }, { role: 'user', content: 'Next task.' }];
    const before = (await curl(`${server.url}/v1/cache/busters`)).body.reports.length;
    const reply = await ask(openai, turn1);
    // That first request did change the id: one more report, which is right.
    const afterFirst = (await curl(`${server.url}/v1/cache/busters`)).body.reports.length;
    assert.equal(afterFirst, before + 1);
    await ask(openai, [...turn1, { role: 'assistant', content: reply.choices[0].message.content || 'ok' },
                       { role: 'user', content: 'And then?' }]);
    // Another client's first prompt is compared with nobody's.
    const other = server.client({ defaultHeaders: { 'x-keepwarm-client': 'second-agent' } });
    await ask(other, [{ role: 'system', content: systemPrompt(randomUUID()) }, { role: 'user', content: 'Hi.' }]);

    const { body } = await curl(`${server.url}/v1/cache/busters`);
    assert.equal(body.reports.length, afterFirst);
    assert.ok(body.reports.every((r) => r.client === 'OpenAI'));
    assert.equal(body.counts[0].count, 2);
});

// The rule auto mode learns from a miss applies to the request that showed the miss too, so the next request hits:
// before, it came in force from the next request on, whose constant then differed from the id the cache held for
// the request before it, and that request missed at the same token once more.
test('auto mode puts a random id\'s rule in force: the very next prompt shares its prefix again', async () => {
    const openai = auto.client();
    const user = { role: 'user', content: 'List the files.' };
    const send = (id) => openai.chat.completions
        .create({ model: 'tiny', messages: [{ role: 'system', content: systemPrompt(id, 'session') }, user],
                  max_tokens: 2, temperature: 0 })
        .withResponse();
    const hex = () => randomBytes(16).toString('hex');
    await send(hex());
    await send(hex());

    const { body } = await curl(`${auto.url}/v1/cache/busters`);
    assert.equal(body.mode, 'auto');
    assert.equal(body.reports.length, 1, JSON.stringify(body));
    const r = body.reports[0];
    assert.equal(r.kind, 'hex_id');
    assert.equal(r.adopted_rule, `auto-${r.rule.name}`);
    const policy = (await curl(`${auto.url}/v1/policy`)).body;
    const rule = policy.spans.find((s) => s.name === r.adopted_rule);
    assert.ok(rule, JSON.stringify(policy.spans));
    assert.equal(rule.origin, 'auto');
    assert.equal(rule.action, 'replace');
    assert.deepEqual(rule.roles, ['system']);
    assert.match(auto.output(), new RegExp(`detect auto: span rule ${r.adopted_rule} .* in force from this request on`));

    // The second request was computed with the constant already: the third reuses the whole prompt but its last token.
    const third = await send(hex());
    assert.match(third.response.headers.get('x-keepwarm-policy'), new RegExp(`span:${r.adopted_rule}\\(replace\\)`));
    const usage = third.data.usage;
    assert.ok(usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1, JSON.stringify(usage));
    // Nothing new to report from the third: it kept its prefix.
    const after = (await curl(`${auto.url}/v1/cache/busters`)).body.reports;
    assert.ok(after.every((x) => x.request_id !== third.data.id), JSON.stringify(after.map((x) => x.request_id)));
    assert.equal(after.filter((x) => x.adopted_rule).length, 1);
});

// The case: a fresh uuid per request in the system prompt (the built-in uuid rule off). One miss, then the
// third request reuses the prompt past the uuid.
test('auto mode: three requests with a fresh uuid each, the third reuses the prefix past the uuid', async () => {
    const openai = auto.client({ defaultHeaders: { 'x-keepwarm-client': 'uuid-agent' } });
    const user = { role: 'user', content: 'List the files.' };
    const send = (id) => openai.chat.completions.create({
        model: 'tiny', messages: [{ role: 'system', content: systemPrompt(id) }, user], max_tokens: 2,
        temperature: 0 });
    await send(randomUUID());
    await send(randomUUID());
    const r = (await curl(`${auto.url}/v1/cache/busters`)).body.reports.find((x) => x.client === 'uuid-agent');
    assert.ok(r, 'the second request missed at the uuid');
    assert.equal(r.kind, 'uuid');
    assert.ok(r.adopted_rule);
    const third = await send(randomUUID());
    const usage = third.usage;
    assert.ok(usage.prompt_tokens_details.cached_tokens > r.span.token_offset + 20, JSON.stringify([usage, r.span]));
    assert.ok(usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 1, JSON.stringify(usage));
});

test('auto mode only reports a clock: changing it would change what the model reads', async () => {
    const openai = auto.client({ defaultHeaders: { 'x-keepwarm-client': 'clock-agent' } });
    const user = { role: 'user', content: 'What time is it?' };
    for (const time of ['2026-06-30T12:34:56Z', '2026-06-30T12:41:07Z']) {
        await openai.chat.completions.create({
            model: 'tiny', messages: [{ role: 'system', content: systemPrompt(time, 'now') }, user],
            max_tokens: 2, temperature: 0 });
    }
    const { body } = await curl(`${auto.url}/v1/cache/busters`);
    const r = body.reports.find((x) => x.client === 'clock-agent');
    assert.ok(r, JSON.stringify(body.reports));
    assert.equal(r.random_id, false);
    assert.equal(r.adopted_rule, null);
    const policy = (await curl(`${auto.url}/v1/policy`)).body;
    assert.equal(policy.detect.mode, 'auto');
    assert.equal(policy.spans.filter((s) => s.origin === 'auto').length, 2);  // the hex id's and the uuid's
});

test('detect mode off compares nothing', async () => {
    const off = await startServer(['-c', '4096', '--policy', offPolicy]);
    try {
        const openai = off.client();
        const user = { role: 'user', content: 'List the files.' };
        for (const id of [randomBytes(16).toString('hex'), randomBytes(16).toString('hex')]) {
            await ask(openai, [{ role: 'system', content: systemPrompt(id, 'session') }, user]);
        }
        const { status, body } = await curl(`${off.url}/v1/cache/busters`);
        assert.equal(status, 200);
        assert.equal(body.mode, 'off');
        assert.deepEqual(body.reports, []);
    } finally {
        await off.stop();
    }
});
