// Speculative decoding with a draft model (llama-server's -md, docs/speculative.md): a server started with one answers
// at temperature 0 what a server without drafting does, the draft model computes the request's tokens in its own
// context (/metrics counts them), and a draft model whose tokenizer is not the model's is refused at start with the
// reason. The draft model is the tiny-draft preset: random weights of its own on the tiny preset's tokenizer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, testModel, metrics, binary } from './harness.mjs';
import { execFile } from 'node:child_process';

let drafting;
let plain;
before(async () => {
    const draft = await testModel('tiny-draft');
    drafting = await startServer(['-c', '4096', '-np', '2', '-md', draft]);
    plain = await startServer(['-c', '4096', '-np', '2', '--spec-type', 'none']);
});
after(async () => Promise.all([drafting?.stop(), plain?.stop()]));

async function chat(server, content, extra = {}) {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }], temperature: 0, max_tokens: 64,
                               ...extra }),
    });
    const text = await res.text();
    assert.equal(res.status, 200, text);
    return JSON.parse(text);
}

test('a server with a draft model answers what one without drafting does', async () => {
    for (const content of ['red green blue yellow red green blue yellow red green', 'Write a haiku about caches.']) {
        // Each prompt once first on both, so that both answer from the same cache state.
        await chat(drafting, content, { max_tokens: 1 });
        await chat(plain, content, { max_tokens: 1 });
        const a = await chat(drafting, content);
        const b = await chat(plain, content);
        assert.equal(a.choices[0].message.content, b.choices[0].message.content);
        assert.equal(a.usage.completion_tokens, b.usage.completion_tokens);
        const c = await chat(drafting, content, { 'speculative.n_max': 0 });
        assert.equal(c.choices[0].message.content, b.choices[0].message.content);
        assert.equal(c.timings?.draft_n, undefined, 'n_max 0: no drafts');
    }
});

test('the draft model computed the requests\' tokens, and /metrics names its drafts\' source', async () => {
    const m = await metrics(drafting.url);
    assert.ok(m.keepwarm_draft_model_computed_tokens_total > 0, JSON.stringify(m));
    assert.ok('keepwarm_draft_model_reused_tokens_total' in m);
    assert.ok('keepwarm_draft_tokens_total{source="draft_model"}' in m);
    // Nothing drafted from the suffix drafter's sources on this server.
    assert.equal(m['keepwarm_draft_tokens_total{source="request"}'], 0);
    assert.equal(m['keepwarm_draft_tokens_total{source="history"}'], 0);
});

// `keepwarm serve` exits with its message instead of listening.
function failedStart(args) {
    return new Promise((resolve) => {
        execFile(binary, ['serve', '--port', '0', '-t', '1', '--cache-disk', '0', ...args], { timeout: 120_000 },
            (error, stdout, stderr) => resolve({ code: error?.code ?? 0, output: stdout + stderr }));
    });
}

test('a draft model with another tokenizer is refused at start with the reason', async () => {
    const model = await testModel('tiny');
    const other = await testModel('tiny-swa');  // Gemma 4's tokenizer
    const r = await failedStart(['-m', model, '-md', other]);
    assert.notEqual(r.code, 0, r.output);
    assert.match(r.output, /cannot draft for this model.*tokenizer/s);
});

test('--spec-type draft-simple without a draft model, or -md with another type, is refused', async () => {
    const model = await testModel('tiny');
    const draft = await testModel('tiny-draft');
    const alone = await failedStart(['-m', model, '--spec-type', 'draft-simple']);
    assert.notEqual(alone.code, 0);
    assert.match(alone.output, /needs a draft model/);
    const mixed = await failedStart(['-m', model, '-md', draft, '--spec-type', 'ngram-mod']);
    assert.notEqual(mixed.code, 0);
    assert.match(mixed.output, /drafts with --spec-type draft-simple/);
});

test('LLAMA_ARG_SPEC_DRAFT_MODEL names the draft model, as for llama-server', async () => {
    const draft = await testModel('tiny-draft');
    const server = await startServer(['-c', '2048'], { env: { LLAMA_ARG_SPEC_DRAFT_MODEL: draft } });
    try {
        await chat(server, 'one two three one two three one two three');
        const m = await metrics(server.url);
        assert.ok(m.keepwarm_draft_model_computed_tokens_total > 0, JSON.stringify(m));
    } finally {
        await server.stop();
    }
});

