// Speculative decoding with a draft model (llama-server's -md, docs/speculative.md): a server started with one answers
// at temperature 0 what a server without drafting does, the draft model computes the request's tokens in its own
// context (/metrics counts them), and a draft model whose tokenizer is not the model's is refused at start with the
// reason; the draft model's own flags (-td, -ctkd, -devd, -otd, ...) are taken, and a bad one stops start-up naming it;
// the router (--models-dir, [models.NAME]) gives each model's server its draft model. The draft model is the tiny-draft preset: random weights of its own on the tiny preset's tokenizer.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, startProcess, testModel, metrics, binary, tempDir, curl } from './harness.mjs';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';

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

// One chat on `server`, then its draft model has computed tokens; the server is stopped either way.
async function expectDraftModelComputes(server) {
    try {
        await chat(server, 'one two three one two three one two three');
        const m = await metrics(server.url);
        assert.ok(m.keepwarm_draft_model_computed_tokens_total > 0, JSON.stringify(m));
    } finally {
        await server.stop();
    }
}

test('LLAMA_ARG_SPEC_DRAFT_MODEL names the draft model, as for llama-server', async () => {
    const draft = await testModel('tiny-draft');
    const server = await startServer(['-c', '2048'], { env: { LLAMA_ARG_SPEC_DRAFT_MODEL: draft } });
    await expectDraftModelComputes(server);
});

test('a settings file names the draft model relative to its own folder', async () => {
    const d = tempDir('draft-config');
    copyFileSync(await testModel('tiny-draft'), path.join(d, 'draft.gguf'));
    writeFileSync(path.join(d, 'keepwarm.toml'), 'spec-draft-model = "draft.gguf"\nctx-size = 2048\n');
    const server = await startServer(['--config', path.join(d, 'keepwarm.toml')]);
    await expectDraftModelComputes(server);
});

test('the draft model\'s own flags are taken: threads, cache types, devices, tensor overrides', async () => {
    const draft = await testModel('tiny-draft');
    // -v: llama.cpp's log, where the draft context's KV types and the override's tensors show.
    const server = await startServer(['-c', '2048', '-np', '1', '-md', draft, '--spec-draft-fixed', '-v',
        '-td', '1', '-tbd', '1', '-ctkd', 'q8_0', '-ctvd', 'q8_0', '-devd', 'none', '-otd', 'blk\\.0\\.ffn_.*=CPU']);
    try {
        const r = await chat(server, 'one two three one two three one two three');
        assert.ok(r.timings?.draft_n > 0, JSON.stringify(r.timings));
        const log = server.output();
        assert.match(log, /tensor blk\.0\.ffn_\w+\.weight .*buffer type overridden to CPU/);
        // Two KV caches: the model's in f16, the draft model's in q8_0.
        assert.match(log, /K \(f16\)/);
        assert.match(log, /K \(q8_0\).*V \(q8_0\)/);
    } finally {
        await server.stop();
    }
});

test('a bad draft-model flag stops start-up with a message naming it', async () => {
    const model = await testModel('tiny');
    const draft = await testModel('tiny-draft');
    const cases = [
        [['-devd', 'GPU77'], /-devd\/--spec-draft-device 'GPU77'.*not a device/],
        [['-otd', 'ffn_.*=VRAM9'], /-otd\/--spec-draft-override-tensor.*'VRAM9' is not a buffer type/],
        [['-otd', 'ffn_.*'], /-otd\/--spec-draft-override-tensor.*PATTERN=BUFFER_TYPE/],
        [['-ctkd', 'q5_9'], /-ctkd\/--spec-draft-type-k 'q5_9' is not one of/],
    ];
    for (const [flags, message] of cases) {
        const r = await failedStart(['-m', model, '-md', draft, ...flags]);
        assert.notEqual(r.code, 0, r.output);
        assert.match(r.output, message);
        assert.doesNotMatch(r.output, /loading the model/, 'refused before the model loads');
    }
    const env = await new Promise((resolve) => {
        execFile(binary, ['serve', '--port', '0', '--cache-disk', '0', '-m', model, '-md', draft], {
            timeout: 120_000, env: { ...process.env, LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V: 'q5_9' },
        }, (error, stdout, stderr) => resolve({ code: error?.code ?? 0, output: stdout + stderr }));
    });
    assert.notEqual(env.code, 0, env.output);
    assert.match(env.output, /-ctvd\/--spec-draft-type-v 'q5_9'/);
});

// A router's model server drafts with the draft model its table names (relative to the settings file), or the router's
// own -md, as llama-server's router passes its arguments to every model; a draft model that does not fit its model
// fails that model's load with the reason, and the router serves the others.
test('the router gives each model its draft model; one that does not fit fails that model alone', async () => {
    const d = tempDir('draft-router');
    mkdirSync(path.join(d, 'models'));
    copyFileSync(await testModel('tiny'), path.join(d, 'models', 'alpha.gguf'));
    copyFileSync(await testModel('tiny-draft'), path.join(d, 'draft.gguf'));
    const tiny = await testModel('tiny');
    writeFileSync(path.join(d, 'keepwarm.toml'), [
        '[models.drafted]', `path = "${tiny}"`, 'spec-draft-model = "draft.gguf"', 'spec-draft-fixed = true',
        '[models.mismatch]', `path = "${tiny}"`, `spec-draft-model = "${await testModel('tiny-swa')}"`,
    ].join('\n'));
    const router = await startProcess(['serve', '--config', path.join(d, 'keepwarm.toml'), '--port', '0', '-t', '1',
        '-c', '2048', '--parallel', '1', '--cache-parked', '0', '--cache-dir', path.join(d, 'cache')]);
    try {
        const drafted = await chat(router, 'one two three one two three one two three', { model: 'drafted' });
        assert.equal(drafted.model, 'drafted');
        assert.ok(drafted.timings?.draft_n > 0, JSON.stringify(drafted.timings));
        assert.match(router.output(), /draft model .*draft\.gguf loaded/);

        const res = await curl(`${router.url}/v1/chat/completions`, { method: 'POST', body: {
            model: 'mismatch', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] } });
        assert.equal(res.status, 503, JSON.stringify(res.body));
        assert.match(res.body.error.message, /model 'mismatch' failed to load: .*cannot draft for this model.*tokenizer/);
        const again = await chat(router, 'still there?', { model: 'drafted' });
        assert.equal(again.model, 'drafted');
    } finally {
        await router.stop();
    }

    // The router's own -md (and its flags) go to every model's server.
    const withDraft = await startProcess(['serve', '--models-dir', path.join(d, 'models'), '-md',
        path.join(d, 'draft.gguf'), '--spec-draft-fixed', '-ctkd', 'q8_0', '--port', '0', '-t', '1', '-c', '2048',
        '--parallel', '1', '--cache-parked', '0', '--cache-dir', path.join(d, 'cache-md')]);
    try {
        const r = await chat(withDraft, 'one two three one two three one two three', { model: 'alpha' });
        assert.equal(r.model, 'alpha');
        assert.ok(r.timings?.draft_n > 0, JSON.stringify(r.timings));
        // Drafted by the draft model, not by the default drafter over the request's own tokens.
        assert.match(withDraft.output(), /draft model .*draft\.gguf loaded/);
    } finally {
        await withDraft.stop();
    }
});
