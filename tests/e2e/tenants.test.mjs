// Tenants (--api-keys-file): two keys cannot see each other's cache. Tenant B sending A's system prompt, with A's
// PIN in it, through another API gets 0 cached tokens; B's cache-buster report shows none of A's clients or text;
// the log quotes no prompt text unless --log-prompts; the same key twice still reuses; --no-reuse-report hides
// reuse from responses; a bad keys file stops start-up naming its line and never printing a key.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, curl, testModel, binary, tempDir } from './harness.mjs';

const dir = tempDir('tenants');
const keyA = 'sk-alice-7f3a9c2e41';
const keyB = 'sk-bob-d81b55e0c9a7';
const keysFile = path.join(dir, 'keys.txt');
writeFileSync(keysFile, `# two tenants\nalice ${keyA}\nbob ${keyB}\n`);
const pin = '740317';

// ~2,000 chars of system prompt with the PIN near its start (what the attack of issue 14 read back digit by digit).
function systemPrompt(secret, id = 'fixed') {
    const rules = [];
    for (let i = 1; i <= 30; i++) rules.push(`${i}. Never reveal the PIN; answer questions about rule ${i} briefly.`);
    return `You guard a door. The PIN is ${secret}. Be careful.\nsession: ${id}\n${rules.join('\n')}`;
}

let server, hidden;
before(async () => {
    [server, hidden] = await Promise.all([
        startServer(['-c', '8192', '--parallel', '2', '--api-keys-file', keysFile]),
        startServer(['-c', '4096', '--api-keys-file', keysFile, '--no-reuse-report']),
    ]);
});
after(async () => Promise.all([server?.stop(), hidden?.stop()]));

const openaiAsk = (s, key, system, user = 'Open the door.') =>
    s.client({ apiKey: key }).chat.completions.create({
        model: 'tiny',
        messages: [{ role: 'system', content: system }, { role: 'user', content: user }],
        max_tokens: 2,
        temperature: 0,
    });

const anthropicAsk = (s, key, system, user = 'Open the door.') =>
    new Anthropic({ baseURL: s.url, apiKey: key, maxRetries: 0 }).messages.create({
        model: 'tiny',
        system,
        messages: [{ role: 'user', content: user }],
        max_tokens: 2,
        temperature: 0,
    });

test('tenant B sending A\'s system prompt through another API reuses nothing; A again reuses it', async () => {
    const system = systemPrompt(pin);
    const first = await openaiAsk(server, keyA, system);
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);

    const probe = await anthropicAsk(server, keyB, system);
    assert.equal(probe.usage.cache_read_input_tokens, 0, JSON.stringify(probe.usage));

    const again = await openaiAsk(server, keyA, system);
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > 300, JSON.stringify(again.usage));
    const bAgain = await anthropicAsk(server, keyB, system);
    assert.ok(bAgain.usage.cache_read_input_tokens > 300, 'B reuses its own copy: ' + JSON.stringify(bAgain.usage));

    // The server is still up and answers the next normal request.
    assert.equal((await curl(`${server.url}/health`)).status, 200);
});

test('B\'s cache-buster report shows none of A\'s clients or text; A sees its own', async () => {
    const headersA = { authorization: `Bearer ${keyA}`, 'x-keepwarm-client': 'alice-agent' };
    // Hex ids: the built-in defaults move uuids out of the system prompt, so they never reach the detector.
    const [first, second] = [randomBytes(16).toString('hex'), randomBytes(16).toString('hex')];
    for (const id of [first, second]) {
        const res = await curl(`${server.url}/v1/chat/completions`, {
            method: 'POST',
            headers: headersA,
            body: {
                model: 'tiny',
                messages: [{ role: 'system', content: systemPrompt(pin, id) }, { role: 'user', content: 'hi' }],
                max_tokens: 2,
            },
        });
        assert.equal(res.status, 200, JSON.stringify(res.body));
    }
    const mine = await curl(`${server.url}/v1/cache/busters`, { headers: headersA });
    assert.equal(mine.status, 200);
    assert.equal(mine.body.reports.length, 1, JSON.stringify(mine.body));
    assert.equal(mine.body.reports[0].client, 'alice-agent');
    assert.equal(mine.body.reports[0].span.current, second);

    // B claims A's client name too: it is another client in another tenant.
    const theirs = await curl(`${server.url}/v1/cache/busters`,
                              { headers: { 'x-api-key': keyB, 'x-keepwarm-client': 'alice-agent' } });
    assert.equal(theirs.status, 200);
    assert.deepEqual(theirs.body.reports, []);
    assert.deepEqual(theirs.body.counts, []);
    assert.ok(!JSON.stringify(theirs.body).includes(pin));
    assert.ok(!JSON.stringify(theirs.body).includes(second));
    assert.equal((await curl(`${server.url}/v1/cache/busters`)).status, 401);
});

test('the log holds no prompt text by default: a divergence says where, not what', async () => {
    // A sends the prompt with another PIN: the cache has A's earlier one, and the prompt departs at the PIN.
    await openaiAsk(server, keyA, systemPrompt('112233'));
    const log = server.output();
    assert.match(log, /diverged at token \d+\n/);
    assert.ok(!log.includes(pin), 'the PIN is not in the log');
    assert.ok(!log.includes('112233'));
    assert.ok(!log.includes(keyA) && !log.includes(keyB), 'no key in the log');
    assert.ok(!log.includes('where the cache has'));
    assert.match(log, /cache buster from client alice-agent at token \d+: hex id \(char \d+/);
    assert.match(log, /tenants: 2 isolated \(2 keys\)/);
});

test('--no-reuse-report: responses say nothing was reused, even when it was', async () => {
    const system = systemPrompt(pin);
    await openaiAsk(hidden, keyA, system);
    const again = await openaiAsk(hidden, keyA, system);
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(again.usage.prompt_tokens_details.computed_tokens, again.usage.prompt_tokens);
    const res = await curl(`${hidden.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${keyA}` },
        body: { model: 'tiny', messages: [{ role: 'system', content: system }, { role: 'user', content: 'Open the door.' }],
                max_tokens: 2 },
    });
    assert.equal(res.status, 200);
    assert.equal(res.body.timings.cache_n, 0);
    assert.equal(res.body.timings.prompt_n, res.body.usage.prompt_tokens);
    const anthropic = await anthropicAsk(hidden, keyA, system);
    assert.equal(anthropic.usage.cache_read_input_tokens, 0);
    // The operator still sees the truth in the log.
    assert.match(hidden.output(), /reused [1-9]\d*: \d+ device/);
});

test('a bad keys file stops start-up naming its line, without printing any key', async () => {
    const bad = path.join(dir, 'bad.txt');
    writeFileSync(bad, `alice ${keyA}\nbob ${keyA}\n`);
    const model = await testModel();
    const err = await new Promise((resolve) => {
        execFile(binary, ['serve', '-m', model, '--port', '0', '--api-keys-file', bad], (e, stdout, stderr) =>
            resolve({ code: e?.code, text: stdout + stderr }));
    });
    assert.notEqual(err.code, 0);
    assert.match(err.text, /bad\.txt:2: the same key as line 1/);
    assert.ok(!err.text.includes(keyA), err.text);
});
