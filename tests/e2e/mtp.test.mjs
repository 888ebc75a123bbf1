// Speculative decoding with the model's own multi-token prediction heads (llama-server's --spec-type draft-mtp,
// docs/speculative.md#mtp-heads): on tiny-hybrid-mtp (Qwen3.5's shape with one nextn layer, random weights) a chat
// answers at temperature 0 what a server that never drafts answers, its timings count the head's drafts, /metrics
// names their source, and a model without the heads is refused at start naming the flag.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { startServer, testModel, metrics, binary } from './harness.mjs';

let mtp;
let plain;
before(async () => {
    // --spec-draft-fixed: drafts verified whole, so that whether the test drafts does not depend on the host's speed.
    mtp = await startServer(['-c', '4096', '-np', '1', '--spec-type', 'draft-mtp', '--spec-draft-fixed'],
        { preset: 'tiny-hybrid-mtp' });
    plain = await startServer(['-c', '4096', '-np', '1', '--spec-type', 'none'], { preset: 'tiny-hybrid-mtp' });
});
after(async () => Promise.all([mtp?.stop(), plain?.stop()]));

async function chat(server, content) {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }], temperature: 0, max_tokens: 48 }),
    });
    const text = await res.text();
    assert.equal(res.status, 200, text);
    return JSON.parse(text);
}

test('draft-mtp: a chat answers what --spec-type none does, with drafts from the MTP head', async () => {
    const content = 'red green blue yellow red green blue yellow red green';
    const a = await chat(mtp, content);
    const b = await chat(plain, content);
    assert.deepEqual(a.choices[0].message, b.choices[0].message);
    assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
    assert.ok(a.timings?.draft_n > 0, `no drafts were verified: ${JSON.stringify(a.timings)}`);
    assert.ok(a.timings.draft_n_accepted >= 0 && a.timings.draft_n_accepted <= a.timings.draft_n);
    assert.equal(b.timings?.draft_n, undefined, '--spec-type none drafts nothing');
    const m = await metrics(mtp.url);
    assert.ok(m['keepwarm_draft_tokens_total{source="mtp"}'] >= a.timings.draft_n, JSON.stringify(m));
});

test('a server not drafting with the MTP heads says so in one line, not a warning per head tensor', async () => {
    assert.match(plain.output(), /MTP head\(s\) are not loaded: --spec-type draft-mtp drafts with them/);
    assert.doesNotMatch(plain.output(), /unused tensor/);
    assert.doesNotMatch(mtp.output(), /MTP head\(s\) are not loaded/);
});

test('draft-mtp on a model without MTP heads is refused at start, naming the flag', async () => {
    const model = await testModel('tiny-hybrid');
    const r = await new Promise((resolve) => {
        execFile(binary, ['serve', '-m', model, '--port', '0', '-t', '1', '--cache-disk', '0', '--spec-type',
            'draft-mtp'], { timeout: 120_000 },
        (error, stdout, stderr) => resolve({ code: error?.code ?? 0, output: stdout + stderr }));
    });
    assert.notEqual(r.code, 0, r.output);
    assert.match(r.output, /--spec-type draft-mtp.*no(ne| MTP)/s);
    assert.match(r.output, /nextn_predict_layers/);
});
