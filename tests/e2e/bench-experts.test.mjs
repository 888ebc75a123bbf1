// `keepwarm bench experts` end to end: record the tiny MoE model's routing, write table, JSON, SVG and the trace,
// re-simulate the trace with other sizes, and clear errors for dense models and bad options.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { binary, testModel, tempDir } from './harness.mjs';

const run = promisify(execFile);

async function fails(args) {
    try {
        await run(binary, args);
    } catch (e) {
        return { code: e.code, stderr: e.stderr + e.stdout };
    }
    assert.fail(`keepwarm ${args.join(' ')} succeeded`);
}

test('bench experts records routing and writes table, JSON, SVG and a trace it can re-simulate', async () => {
    const model = await testModel('tiny-moe');
    const dir = tempDir('bench-experts');
    const json = path.join(dir, 'experts.json');
    const svg = path.join(dir, 'experts.svg');
    const trace = path.join(dir, 'trace.bin');
    const first = await run(
        binary,
        ['bench', 'experts', '-m', model, '--gen', '8', '-t', '1', '--json', json, '--svg', svg, '--trace-out', trace],
        { timeout: 300_000 },
    );
    assert.match(first.stderr, /\[prefill\] \d+ tokens/);
    assert.match(first.stderr, /\[decode\]/);
    assert.match(first.stdout, /LRU hit %/);
    assert.match(first.stdout, /gated uploads\/tok/);
    assert.match(first.stdout, /4 MoE layers, 8 experts, 2 used per token/);

    const report = JSON.parse(readFileSync(json, 'utf8'));
    assert.equal(report.n_expert, 8);
    assert.equal(report.moe_layers, 4);
    const tokens = report.tokens.prompt + report.tokens.generated;
    assert.ok(report.tokens.prompt > 300 && report.tokens.generated <= 8);
    // Default sizes 1, 2, 4, 8, each with both policies.
    assert.deepEqual(
        report.results.map((r) => `${r.policy}@${r.slots}`),
        ['lru@1', 'gated@1', 'lru@2', 'gated@2', 'lru@4', 'gated@4', 'lru@8', 'gated@8'],
    );
    for (const r of report.results) {
        assert.equal(r.lookups, tokens * 2 * 4);
        assert.equal(r.hits + r.fills + r.streamed, r.lookups);
        assert.ok(r.hit_rate >= 0 && r.hit_rate <= 1);
        assert.ok(r.bytes_per_token <= report.uncached.bytes_per_token);
    }
    const lru = report.results.filter((r) => r.policy === 'lru');
    for (let i = 1; i < lru.length; i++) assert.ok(lru[i].hits >= lru[i - 1].hits, 'LRU is a stack algorithm');
    assert.ok(lru[3].fills <= 8 * 4, 'with every expert resident only cold misses remain');
    assert.equal(lru[3].evictions, 0);

    const chart = readFileSync(svg, 'utf8');
    assert.ok(chart.startsWith('<svg'));
    assert.match(chart, /class="policy-lru"/);
    assert.match(chart, /class="policy-gated"/);

    // The recorded trace replays without the model: same LRU numbers at the same sizes, new gate settings apply.
    const json2 = path.join(dir, 'replay.json');
    const replay = await run(binary, [
        'bench', 'experts', '--trace-in', trace, '--slots', '2,8', '--admit-k', '3', '--admit-window', '8',
        '--json', json2,
    ]);
    assert.doesNotMatch(replay.stderr, /\[prefill\]/);
    assert.match(replay.stdout, /after 3 uses in the last 8 tokens/);
    const again = JSON.parse(readFileSync(json2, 'utf8'));
    assert.deepEqual(again.admission, { k: 3, window: 8 });
    assert.deepEqual(again.results.find((r) => r.policy === 'lru' && r.slots === 2), lru[1]);
    assert.deepEqual(again.results.find((r) => r.policy === 'lru' && r.slots === 8), lru[3]);
});

test('bench experts refuses dense models and bad options with a clear error', async () => {
    const dense = await fails(['bench', 'experts', '-m', await testModel('tiny'), '--gen', '1', '-t', '1']);
    assert.equal(dense.code, 1);
    assert.match(dense.stderr, /not a mixture-of-experts model/);

    const moe = await testModel('tiny-moe');
    const zero = await fails(['bench', 'experts', '-m', moe, '--slots', '0,4']);
    assert.equal(zero.code, 1);
    assert.match(zero.stderr, /bad slot count '0'/);
    const gate = await fails(['bench', 'experts', '-m', moe, '--admit-k', '5', '--admit-window', '2']);
    assert.equal(gate.code, 1);
    assert.match(gate.stderr, /--admit-k 5 can never be reached/);
    const both = await fails(['bench', 'experts', '-m', moe, '--trace-in', '/tmp/x.bin']);
    assert.ok(both.code > 0);
    assert.match(both.stderr, /excludes/);
    const neither = await fails(['bench', 'experts']);
    assert.equal(neither.code, 1);
    assert.match(neither.stderr, /give a model/);
    const missing = await fails(['bench', 'experts', '--trace-in', '/nonexistent/trace.bin']);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /nonexistent/);
    const tooMany = await fails(['bench', 'experts', '-m', moe, '--gen', '1', '-t', '1', '--slots', '4,16']);
    assert.equal(tooMany.code, 1);
    assert.match(tooMany.stderr, /16 is more than the model's 8 experts/);
});
