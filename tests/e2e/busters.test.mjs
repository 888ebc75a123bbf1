// Cache-buster detection on the real server with the official openai client: two requests whose system prompts
// differ only by a `request-id: <uuid>` near the start show up in GET /v1/cache/busters (client, span, position,
// cost, suggested rule) and in the log.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { startServer, curl } from './harness.mjs';

let server;
before(async () => {
    server = await startServer(['-c', '4096']);
});
after(async () => server?.stop());

// A system prompt of ~2,500 chars (several hundred tokens) with a per-request id in its second line.
function systemPrompt(requestId) {
    const rules = [];
    for (let i = 1; i <= 40; i++) rules.push(`${i}. Read the relevant files before you change rule ${i}; keep edits small.`);
    return `You are a coding agent.\nrequest-id: ${requestId}\n${rules.join('\n')}`;
}

const ask = (openai, messages) =>
    openai.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, temperature: 0 });

test('a per-request uuid in the system prompt is reported with its client, position, cost and rule', async () => {
    const openai = server.client();
    const [first, second] = [randomUUID(), randomUUID()];
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
    assert.equal(r.cost_tokens, busted.usage.prompt_tokens - r.span.token_offset);
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
