// `keepwarm doctor` on captured request bodies (tests/fixtures/doctor): where two prompts part as the model reads
// them, what that costs, the span's kind and the suggested rule; exit 0 / 1 / 2 for same / diverged / bad input.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { binary, testModel } from './harness.mjs';

const fixtures = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'fixtures', 'doctor');

// Runs `keepwarm doctor` and resolves with { code, stdout, stderr } whatever the exit status.
async function doctor(a, b, ...args) {
    const model = await testModel('tiny');
    return new Promise((resolve) => {
        execFile(binary, ['doctor', path.join(fixtures, a), path.join(fixtures, b), '-m', model, ...args],
                 (error, stdout, stderr) => resolve({ code: error ? error.code : 0, stdout, stderr }));
    });
}

test('a per-request cch nonce: divergence, cost, a hex id and a replace rule', async () => {
    // --no-policy: the bodies as sent (the built-in defaults would remove the nonce, see below).
    const text = await doctor('openai-a.json', 'openai-b-new-cch.json', '--no-policy');
    assert.equal(text.code, 1, text.stderr);
    assert.match(text.stdout, /first divergence: char \d+, token \d+, message 0 \(system\)/);
    assert.match(text.stdout, /cch=" \+ "5f2e1" \+ ";/);
    assert.match(text.stdout, /cch=" \+ "a03b9" \+ ";/);
    assert.match(text.stdout, /span: hex id/);
    assert.match(text.stdout, /pattern = 'cch=\[0-9a-f\]\{5\}'/);

    const { code, stdout } = await doctor('openai-a.json', 'openai-b-new-cch.json', '--json', '--no-policy');
    assert.equal(code, 1);
    const report = JSON.parse(stdout);
    assert.equal(report.result, 'diverged');
    assert.equal(report.a.api, 'openai chat');
    assert.deepEqual(report.b.policy, []);
    const d = report.divergence;
    assert.equal(d.message_index, 0);
    assert.equal(d.role, 'system');
    assert.ok(d.token_offset > 0 && d.token_offset < 60, `token ${d.token_offset}: near the start`);
    assert.equal(d.a.text, '5f2e1');
    assert.equal(d.b.text, 'a03b9');
    assert.ok(d.a.before.endsWith('cch='));
    // Everything of B from the divergence on is computed again.
    assert.equal(d.cost_tokens, report.b.tokens - d.token_offset);
    assert.equal(report.span.kind, 'hex_id');
    assert.equal(report.span.random_id, true);
    assert.ok(report.span.agreed_chars_after > 3000);
    assert.equal(report.rule.pattern, 'cch=[0-9a-f]{5}');
    assert.equal(report.rule.action, 'replace');
    assert.equal(report.rule.replacement, 'cch=00000');
    assert.match(report.rule.toml, /\[\[spans\.rule\]\]/);
});

// Without --policy, doctor runs the policy `serve` runs without one (the built-in defaults, selected by the same
// code): the billing header's nonce is normalized, so B reuses all of A, as it would from the server's cache.
test('without --policy the built-in defaults apply, as in serve', async () => {
    const { code, stdout, stderr } = await doctor('openai-a.json', 'openai-b-new-cch.json', '--json');
    assert.equal(code, 0, stderr + stdout);
    const report = JSON.parse(stdout);
    assert.ok(['identical', 'extends'].includes(report.result), stdout);
    assert.equal(report.reused_tokens, report.a.tokens, 'B reuses every token of A');
    assert.ok(report.b.policy.includes('span:claude-code-billing(replace)'), JSON.stringify(report.b.policy));
    const both = await doctor('openai-a.json', 'openai-b-new-cch.json', '--no-policy', '--policy', 'x.toml');
    assert.notEqual(both.code, 0, 'give a policy or --no-policy, not both');
    assert.match(both.stderr, /excludes/);
});

test('identical bodies and a body that extends the other exit 0', async () => {
    const same = await doctor('openai-a.json', 'openai-a.json');
    assert.equal(same.code, 0, same.stderr);
    assert.match(same.stdout, /render the same prompt/);
    const next = await doctor('openai-a.json', 'openai-a-next.json', '--json');
    assert.equal(next.code, 0, next.stderr);
    const report = JSON.parse(next.stdout);
    assert.equal(report.result, 'extends');
    assert.equal(report.reused_tokens, report.a.tokens);
    assert.equal(report.new_tokens, report.b.tokens - report.a.tokens);
});

test('an unrelated prompt diverges with no span to remove', async () => {
    const { code, stdout } = await doctor('openai-a.json', 'openai-other.json', '--json');
    assert.equal(code, 1);
    const report = JSON.parse(stdout);
    assert.equal(report.result, 'diverged');
    assert.equal(report.span, null);
    assert.equal(report.rule, null);
    assert.equal(report.divergence.cost_tokens, report.b.tokens - report.divergence.token_offset);
});

test('bad input exits 2 naming the file and the problem', async () => {
    const notJson = await doctor('not-json.json', 'openai-a.json');
    assert.equal(notJson.code, 2);
    assert.match(notJson.stderr, /not-json\.json: not valid JSON/);
    const badRole = await doctor('openai-a.json', 'openai-bad-role.json');
    assert.equal(badRole.code, 2);
    assert.match(badRole.stderr, /openai-bad-role\.json: .*role/);
    const missing = await doctor('openai-a.json', 'no-such-file.json');
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /no-such-file\.json: cannot read/);
});

// With the policy file `serve` would run, both bodies go through its rules first: the built-in claude-code-billing
// rule replaces the nonce, so B reuses all of A.
test('--policy applies the policy file before rendering, and the nonce no longer parts the prompts', async () => {
    const policy = path.join(fixtures, '..', '..', '..', 'etc', 'keepwarm-policy.toml');
    const { code, stdout, stderr } = await doctor('openai-a.json', 'openai-b-new-cch.json', '--policy', policy, '--json');
    assert.equal(code, 0, stderr + stdout);
    const report = JSON.parse(stdout);
    assert.ok(['identical', 'extends'].includes(report.result), stdout);
    assert.equal(report.reused_tokens, report.a.tokens, 'B reuses every token of A');
    assert.ok(report.b.policy.includes('span:claude-code-billing(replace)'), JSON.stringify(report.b.policy));
    const text = await doctor('openai-a.json', 'openai-b-new-cch.json', '--policy', policy);
    assert.match(text.stdout, /policy on B:.* span:claude-code-billing\(replace\);/);
    const bad = await doctor('openai-a.json', 'openai-b-new-cch.json', '--policy', path.join(fixtures, 'not-json.json'));
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /not-json\.json/);
});
