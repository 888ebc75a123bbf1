// Speculative decoding's history after a restart (issue 36, docs/speculative.md "History"): the conversations the
// disk tier holds join their tenants' histories at start-up, so a request that repeats one drafts its answer from
// the history at once. A server that stopped gracefully wrote its conversations to the disk tier; the one started on
// the same --cache-dir answers the same request with drafts from source "history" (/metrics) and accepted ones in its
// timings. Without the history rebuilt, only the request's own tokens could draft, and the history counter stays 0.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, metrics } from './harness.mjs';

const servers = [];
after(async () => Promise.all(servers.map((s) => s.stop())));

// --spec-draft-fixed: drafts verified whole, so that what is drafted does not depend on the host's speed.
const args = ['-c', '4096', '-np', '1', '--spec-draft-fixed'];

async function complete(url, prompt) {
    const res = await fetch(`${url}/completion`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt, n_predict: 64, temperature: 0, ignore_eos: true }),
    });
    const text = await res.text();
    assert.equal(res.status, 200, text);
    return JSON.parse(text);
}

const historyAccepted = (m) => m['keepwarm_draft_accepted_total{source="history"}'];

test('a restarted server drafts an earlier answer from the conversations its disk tier holds', async () => {
    // Varied text, so that the answer is not the prompt repeated (which the request's own tokens would draft).
    const prompt = 'Write about the harbour at dawn: gulls, rope, tar, a bell, fog lifting off green water near '
        + 'the old customs house, where a baker opens shutters and two fishermen argue about the weather.';
    const first = await startServer(args);
    servers.push(first);
    const before = await complete(first.url, prompt);
    assert.equal(historyAccepted(await metrics(first.url)), 0, 'nothing earlier to draft from');
    assert.equal(await first.stop(), 0);
    servers.pop();

    const restarted = await startServer(args, { cacheDir: first.cacheDir });
    servers.push(restarted);
    const again = await complete(restarted.url, prompt);
    assert.equal(again.content, before.content, 'the same answer, drafted or not');
    assert.ok(again.timings.draft_n_accepted > 0, JSON.stringify(again.timings));
    const m = await metrics(restarted.url);
    const drafts = Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith('keepwarm_draft_')));
    assert.ok(historyAccepted(m) > 0, `drafts accepted from the history: ${JSON.stringify(drafts)}`);
});
