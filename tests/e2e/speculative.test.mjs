// Speculative decoding (issue 36) changes how fast an answer comes, never what it is: at temperature 0 an answer with
// drafting (the default, --spec-type suffix) is byte-identical to one without, whether drafting is off for the
// request ("speculative.n_max": 0, llama-server's per-request field) or for the server (--spec-type none). Checked
// through the OpenAI chat API, Anthropic Messages and llama-server's /completion, streamed and whole, with tools (a
// grammar), a stop string, a token limit, and two requests decoded together (two slots).
// The comparison is only worth something if drafts were verified and accepted: the model has random weights and
// loops, so prompts that repeat themselves make the answer repeat the prompt or itself, which the suffix drafter
// finds; every drafting run records its timings' draft_n / draft_n_accepted, and the suite checks that they add up
// to more than nothing (and /metrics' draft counters with them).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, metrics } from './harness.mjs';

// The harness runs every server on one thread: on several, a lone decode row whose attention spans 512 KV cells or
// more takes ggml's split-KV path (per-thread chunks, then a reduction) and a verifying step of several rows does
// not, so a greedy answer may part at a near tie (docs/speculative.md; test-speculative shows it).
let server;  // the default: drafting on
let plain;   // --spec-type none
let plainError;  // why it did not start (a build without the engine's --spec-type: the test naming it fails)
before(async () => {
    // --spec-draft-fixed: drafts verified whole, so that whether a test drafts does not depend on the host's speed or
    // load (sized by measured costs, a busy host verified none in 7 of these tests).
    server = await startServer(['-c', '4096', '-np', '2', '--spec-draft-fixed']);
    plain = await startServer(['-c', '4096', '-np', '2', '--spec-type', 'none']).catch((e) => {
        plainError = e;
        return undefined;
    });
});
after(async () => Promise.all([server?.stop(), plain?.stop()]));

// Text that repeats itself, so that a looping model's answer repeats it too.
const repeated = (phrase, times) => Array.from({ length: times }, () => phrase).join(' ');
const loopText = repeated('red green blue yellow red green blue yellow', 12);
const countText = repeated('one two three four five six seven eight', 12);

// Every drafting run's draft counts on the shared server, for the suite-wide check at the end (runs on a server of
// their own are not in its /metrics).
const drafted = { runs: 0, draft_n: 0, accepted: 0 };
function recordDrafts(timings, on = server) {
    if (on !== server) return;
    drafted.runs++;
    drafted.draft_n += timings?.draft_n ?? 0;
    drafted.accepted += timings?.draft_n_accepted ?? 0;
}

async function post(url, path, body) {
    const res = await fetch(url + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
    });
    const text = await res.text();
    assert.equal(res.status, 200, `${path}: ${text}`);
    return JSON.parse(text);
}

// The data objects of a server-sent event stream.
async function postStream(url, path, body) {
    const res = await fetch(url + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, stream: true }),
    });
    const text = await res.text();
    assert.equal(res.status, 200, `${path}: ${text}`);
    const events = [];
    for (const line of text.split('\n')) {
        if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
        events.push(JSON.parse(line.slice(6)));
    }
    return events;
}

// One answer of each API, reduced to { text, timings, finish }: the text is everything the client would show (content,
// and tool calls in the order they came), so that "identical" covers it all.
const apis = {
    async openai(url, body, stream) {
        if (!stream) {
            const r = await post(url, '/v1/chat/completions', { model: 'tiny', ...body });
            const m = r.choices[0].message;
            return { text: (m.content ?? '') + JSON.stringify(m.tool_calls ?? []), timings: r.timings,
                     finish: r.choices[0].finish_reason, tokens: r.usage.completion_tokens };
        }
        const events = await postStream(url, '/v1/chat/completions',
            { model: 'tiny', ...body, stream_options: { include_usage: true } });
        let text = '';
        const calls = [];
        let timings, finish, tokens;
        for (const e of events) {
            timings ??= e.timings;
            if (e.usage) tokens = e.usage.completion_tokens;
            for (const c of e.choices ?? []) {
                text += c.delta?.content ?? '';
                for (const call of c.delta?.tool_calls ?? []) {
                    calls[call.index] ??= { name: '', arguments: '' };
                    calls[call.index].name += call.function?.name ?? '';
                    calls[call.index].arguments += call.function?.arguments ?? '';
                }
                finish = c.finish_reason ?? finish;
            }
        }
        const whole = calls.map((c) => ({ name: c.name, arguments: c.arguments }));
        return { text: text + JSON.stringify(whole), timings, finish, tokens, streamedCalls: whole };
    },
    async anthropic(url, body, stream) {
        const { messages, max_tokens = 64, stop, tools, ...rest } = body;
        const request = { model: 'tiny', messages, max_tokens, ...rest };
        if (stop) request.stop_sequences = [stop].flat();
        if (tools) request.tools = tools.map((t) => ({ name: t.function.name, description: t.function.description,
                                                      input_schema: t.function.parameters }));
        delete request.tool_choice;
        delete request.logit_bias;
        if (!stream) {
            const r = await post(url, '/v1/messages', request);
            return { text: r.content.map((b) => (b.type === 'text' ? b.text : JSON.stringify(b.input))).join(''),
                     timings: r.timings, finish: r.stop_reason, tokens: r.usage.output_tokens };
        }
        const events = await postStream(url, '/v1/messages', request);
        let text = '', timings, finish, tokens;
        for (const e of events) {
            if (e.type === 'content_block_delta') text += e.delta.text ?? e.delta.partial_json ?? '';
            if (e.type === 'message_delta') {
                timings = e.timings;
                finish = e.delta.stop_reason;
                tokens = e.usage.output_tokens;
            }
        }
        return { text, timings, finish, tokens };
    },
    // llama-server's /completion: the chat's user messages as one raw prompt.
    async completion(url, body, stream) {
        const { messages, max_tokens, stop, ...rest } = body;
        delete rest.tools;
        delete rest.tool_choice;
        const request = { prompt: messages.map((m) => m.content).join('\n'), n_predict: max_tokens ?? 64, ...rest };
        if (stop) request.stop = [stop].flat();
        if (!stream) {
            const r = await post(url, '/completion', request);
            return { text: r.content, timings: r.timings, finish: r.stop_type, tokens: r.tokens_predicted };
        }
        const events = await postStream(url, '/completion', request);
        const last = events.at(-1);
        assert.equal(last.stop, true);
        return { text: events.map((e) => e.content).join(''), timings: last.timings, finish: last.stop_type,
                 tokens: last.tokens_predicted };
    },
};

const off = { 'speculative.n_max': 0 };

// The request with drafting, then without (n_max 0 here, and on the --spec-type none server): the same answer, and
// no drafts where drafting was off.
// Every run of a comparison finds the prompt in the same cache state (all but its last token reused, after a warm-up
// run): a random-weight model's near-ties flip with how the prompt's KV was computed (cold in one batch, or partly
// reused), which is no matter of drafting. For the same reason the --spec-type none server is compared on prompts that
// neither server has seen before (`crossServer`), so that both compute them the same way.
async function compare(api, body, stream, { on = server, crossServer = false } = {}) {
    await apis[api](on.url, { ...body, ...off }, false);
    const spec = await apis[api](on.url, body, stream);
    recordDrafts(spec.timings, on);
    const noDraft = await apis[api](on.url, { ...body, ...off }, stream);
    const what = `${api} ${stream ? 'stream' : 'whole'}`;
    assert.equal(spec.text, noDraft.text, `${what}: drafting changed the answer (n_max 0 differs)`);
    assert.equal(spec.finish, noDraft.finish, what);
    assert.equal(spec.tokens, noDraft.tokens, `${what}: as many tokens either way`);
    assert.equal(noDraft.timings?.draft_n, undefined, `${what}: n_max 0 drafts nothing: ${JSON.stringify(noDraft.timings)}`);
    if (crossServer) {
        await apis[api](plain.url, body, false);
        const none = await apis[api](plain.url, body, stream);
        assert.equal(spec.text, none.text, `${what}: drafting changed the answer (--spec-type none differs)`);
        assert.equal(spec.finish, none.finish, what);
        assert.equal(none.timings?.draft_n, undefined, `${what}: --spec-type none drafts nothing`);
    }
    return { spec, noDraft };
}

// Waits for the engine (issue 36): asserts that a drafting run did verify drafts.
function assertDrafted(result, what) {
    assert.ok(result.timings?.draft_n > 0, `${what}: no drafts were verified: ${JSON.stringify(result.timings)}`);
    assert.ok(result.timings.draft_n_accepted >= 0 && result.timings.draft_n_accepted <= result.timings.draft_n);
}

const loopChat = { messages: [{ role: 'user', content: loopText }], temperature: 0, max_tokens: 96 };
const countChat = { messages: [{ role: 'user', content: countText }], temperature: 0, max_tokens: 96 };

// First, so that both servers have the same history: every prompt's template prefix was computed the same way.
test('a server started with --spec-type none answers what the drafting server does', async () => {
    assert.ok(plain, `keepwarm serve --spec-type none did not start: ${plainError?.message.slice(0, 300)}`);
    for (const api of ['openai', 'anthropic', 'completion']) {
        for (const stream of [false, true]) {
            const fresh = repeated(`alpha beta gamma delta ${api} ${stream}`, 12);
            const body = { messages: [{ role: 'user', content: fresh }], temperature: 0, max_tokens: 64 };
            await compare(api, body, stream, { crossServer: true });
        }
    }
});

for (const api of ['openai', 'anthropic', 'completion']) {
    for (const stream of [false, true]) {
        test(`${api} ${stream ? 'streamed' : 'whole'}: drafting answers exactly what no drafting does`, async () => {
            const { spec } = await compare(api, loopChat, stream);
            assert.ok(spec.text.length > 0);
            assertDrafted(spec, api);
        });
    }
}

test('a stop string ends the drafted answer where it ends the plain one', async () => {
    for (const api of ['openai', 'anthropic', 'completion']) {
        // A stop string from the middle of the plain answer: a draft that runs past it must not leak text.
        const { text } = await apis[api](server.url, { ...countChat, ...off }, false);
        assert.ok(text.length > 20, `${api}: too little text to pick a stop string from: ${JSON.stringify(text)}`);
        const middle = Math.floor(text.length / 2);
        const stop = text.slice(middle, middle + 6);
        for (const stream of [false, true]) {
            const { spec } = await compare(api, { ...countChat, stop }, stream);
            assert.ok(!spec.text.includes(stop), `${api}: the stop string is not part of the answer`);
            assert.ok(['stop', 'stop_sequence', 'word'].includes(spec.finish), `${api}: ${spec.finish}`);
        }
    }
});

test('a token limit cuts the drafted answer at the same token', async () => {
    // A draft may reach past the limit: the answer still ends at max_tokens, with what the plain run wrote.
    for (const max_tokens of [1, 5, 13]) {
        for (const api of ['openai', 'anthropic', 'completion']) {
            for (const stream of [false, true]) {
                const { spec } = await compare(api, { ...loopChat, max_tokens }, stream);
                assert.equal(spec.tokens, max_tokens, `${api} max_tokens ${max_tokens}`);
                assert.ok(['length', 'max_tokens', 'limit'].includes(spec.finish), `${api}: ${spec.finish}`);
            }
        }
    }
});

// Tools: the grammar forces a call (see tools.test.mjs), and drafted tokens go through it as sampled ones do.
// On a server of its own: the engine learns what a draft row costs, and a grammar's checks of every drafted token
// make rows dear enough that it may stop drafting for a while, which the other tests must not inherit.
test('with tools and a grammar, drafting calls the same tool with the same arguments', async (t) => {
    const own = await startServer(['-c', '4096', '-np', '2', '--spec-draft-fixed']);
    t.after(() => own.stop());
    const tokenize = async (content) =>
        (await curl(`${own.url}/tokenize`, { method: 'POST', body: { content } })).body.tokens;
    const [endOfTurn] = await tokenize('<|im_end|>');
    const [closeTag] = await tokenize('</tool_call>');
    const tools = [{
        type: 'function',
        function: {
            name: 'echo_words',
            description: 'Repeats words',
            parameters: {
                type: 'object',
                properties: { words: { type: 'string' } },
                required: ['words'],
                additionalProperties: false,
            },
        },
    }];
    const body = {
        messages: [{ role: 'user', content: `Call echo_words with: ${loopText}` },
                   { role: 'assistant', content: '<tool_call>\n{"name": "echo_words", "arguments": {"words": "red green blue' }],
        tools, tool_choice: 'required', temperature: 0, max_tokens: 48,
        logit_bias: { [endOfTurn]: 20, [closeTag]: 20 },
    };
    const runs = [];
    for (const stream of [false, true]) runs.push((await compare('openai', body, stream, { on: own })).spec);
    assert.ok(runs.some((r) => r.timings?.draft_n > 0), `no drafts: ${JSON.stringify(runs.map((r) => r.timings))}`);
    // Anthropic's tool definitions, no grammar forced: the prompt carries the tools, the answer must still match.
    for (const stream of [false, true]) await compare('anthropic', { ...loopChat, tools }, stream, { on: own });
});

test('two requests decoded together (two slots) draft each by its own n_max and answer in full', async () => {
    // Not compared byte for byte: a rejected draft's cells are freed, and the next step's token of the other slot may
    // fill them, below that slot's earlier cells; attention then sums its KV in another order, and a random model's
    // near-tie may flip (docs/speculative.md). With a fixed schedule the engine's pairs agree bit for bit
    // (tests/unit/test-speculative.cpp); here admission order depends on HTTP timing.
    const alphaChat = { ...loopChat, messages: [{ role: 'user', content: repeated('alpha beta gamma delta', 24) }] };
    const bodies = [loopChat, alphaChat];
    const pairOff = () => Promise.all(bodies.map((body) => apis.openai(server.url, { ...body, ...off }, false)));
    await pairOff();  // warm, as compare() does
    for (const stream of [false, true]) {
        const baseline = await pairOff();
        const together = await Promise.all(bodies.map((body) => apis.openai(server.url, body, stream)));
        together.forEach((r, i) => {
            recordDrafts(r.timings);
            assert.equal(r.finish, baseline[i].finish, `request ${i} ${stream ? 'streamed' : 'whole'}`);
            assert.equal(r.tokens, baseline[i].tokens, `request ${i} ${stream ? 'streamed' : 'whole'}: as many tokens`);
        });
        assert.ok(together.some((r) => r.timings?.draft_n > 0),
            `neither request drafted: ${JSON.stringify(together.map((r) => r.timings))}`);
    }
    // With drafting off for one of them: each request has its own n_max.
    const mixed = await Promise.all([apis.openai(server.url, { ...bodies[0], ...off }, false),
                                     apis.openai(server.url, bodies[1], false)]);
    assert.equal(mixed[0].timings?.draft_n, undefined, 'the request with n_max 0 drafted nothing');
    assert.equal(mixed[1].tokens, 96, 'the request drafting, beside one without, answers in full');
});

// The per-request switch reaches the engine through the other APIs with timings too: OpenAI's /v1/completions and
// Responses (Ollama's answers carry no timings; its option is checked for a 400 below).
test('speculative.n_max 0 turns drafting off through /v1/completions and Responses, with the same answer', async () => {
    const ask = {
        async completions(extra) {
            const r = await post(server.url, '/v1/completions',
                { model: 'tiny', prompt: loopText, temperature: 0, max_tokens: 64, ...extra });
            return { text: r.choices[0].text, timings: r.timings };
        },
        async responses(extra) {
            const r = await post(server.url, '/v1/responses',
                { model: 'tiny', input: loopText, temperature: 0, max_output_tokens: 64, store: false, ...extra });
            const text = r.output.flatMap((item) => item.content ?? []).map((c) => c.text ?? '').join('');
            return { text, timings: r.timings };
        },
    };
    for (const [api, run] of Object.entries(ask)) {
        await run(off);  // warm, as compare() does
        const spec = await run({});
        recordDrafts(spec.timings);
        const noDraft = await run(off);
        assert.ok(spec.text.length > 0, api);
        assert.equal(spec.text, noDraft.text, `${api}: drafting changed the answer`);
        assert.equal(noDraft.timings?.draft_n, undefined, `${api}: n_max 0 drafts nothing`);
        assertDrafted(spec, api);
    }
});

// A bad value is refused in each API's own error shape, before anything is generated.
test('a bad speculative.n_max is a 400 in the shape of the API it came through', async () => {
    const bad = { 'speculative.n_max': -1 };
    const openai = await curl(`${server.url}/v1/chat/completions`, { method: 'POST',
        body: { model: 'tiny', messages: [{ role: 'user', content: 'hi' }], ...bad } });
    assert.equal(openai.status, 400);
    assert.match(openai.body.error.message, /speculative\.n_max/);
    assert.equal(openai.body.error.type, 'invalid_request_error');
    const completions = await curl(`${server.url}/v1/completions`, { method: 'POST',
        body: { model: 'tiny', prompt: 'hi', 'speculative.n_max': 5000 } });
    assert.equal(completions.status, 400);
    assert.match(completions.body.error.message, /speculative\.n_max/);
    const anthropic = await curl(`${server.url}/v1/messages`, { method: 'POST',
        body: { model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], 'speculative.n_max': 'x' } });
    assert.equal(anthropic.status, 400);
    assert.equal(anthropic.body.type, 'error');
    assert.equal(anthropic.body.error.type, 'invalid_request_error');
    assert.match(anthropic.body.error.message, /speculative\.n_max/);
    const native = await curl(`${server.url}/completion`, { method: 'POST',
        body: { prompt: 'hi', 'speculative.p_min': 2 } });
    assert.equal(native.status, 400);
    assert.match(native.body.error.message, /speculative\.p_min/);
    const responses = await curl(`${server.url}/v1/responses`, { method: 'POST',
        body: { model: 'tiny', input: 'hi', ...bad } });
    assert.equal(responses.status, 400);
    assert.match(responses.body.error.message, /speculative\.n_max/);
    const ollama = await curl(`${server.url}/api/chat`, { method: 'POST',
        body: { model: 'tiny', stream: false, messages: [{ role: 'user', content: 'hi' }], options: bad } });
    assert.equal(ollama.status, 400);
    assert.match(ollama.body.error, /options\.speculative\.n_max/);
    // A good one is served by every API (Ollama's under options).
    const ok = await curl(`${server.url}/api/generate`, { method: 'POST',
        body: { model: 'tiny', stream: false, prompt: 'hi', options: { num_predict: 3, 'speculative.n_max': 0 } } });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    const responsesOk = await curl(`${server.url}/v1/responses`, { method: 'POST',
        body: { model: 'tiny', input: 'hi', max_output_tokens: 3, 'speculative.n_max': 2 } });
    assert.equal(responsesOk.status, 200, JSON.stringify(responsesOk.body));
});

// Runs last (node:test runs a file's tests in order): the whole suite drafted, and some drafts were accepted.
test('across the suite drafts were verified and accepted, and /metrics counts them', async () => {
    assert.ok(drafted.runs > 0);
    assert.ok(drafted.draft_n > 0, `no drafting run verified a draft: ${JSON.stringify(drafted)}`);
    assert.ok(drafted.accepted > 0, `no draft token was accepted: ${JSON.stringify(drafted)}`);
    const m = await metrics(server.url);
    const sum = (family) => Object.entries(m).filter(([k]) => k.startsWith(`${family}{source=`))
        .reduce((a, [, v]) => a + v, 0);
    for (const family of ['keepwarm_draft_drafts_total', 'keepwarm_draft_tokens_total', 'keepwarm_draft_accepted_total']) {
        for (const source of ['request', 'history', 'llama']) {
            assert.ok(`${family}{source="${source}"}` in m, `${family} has a sample for ${source}`);
        }
    }
    assert.ok(sum('keepwarm_draft_tokens_total') >= drafted.draft_n, JSON.stringify(m));
    assert.ok(sum('keepwarm_draft_accepted_total') >= drafted.accepted);
    assert.ok(sum('keepwarm_draft_drafts_total') > 0);
    assert.ok(m.keepwarm_answer_steps_total > 0);
    const { body: text } = await curl(`${server.url}/metrics`, { raw: true });
    assert.equal(Number(text.match(/^llamacpp:spec_decode_num_draft_tokens_total (\S+)$/m)?.[1]),
        sum('keepwarm_draft_tokens_total'), 'llama-server\'s counter sums the sources');
    // The server without drafting verified none.
    assert.ok(plain, 'the --spec-type none server runs');
    const p = await metrics(plain.url);
    assert.equal(Object.entries(p).filter(([k]) => k.startsWith('keepwarm_draft_tokens_total'))
        .reduce((a, [, v]) => a + v, 0), 0);
});

// A hybrid model (tiny-hybrid: Qwen3.5's gated delta-net + attention) drafts too, rolling its recurrent state back
// through llama.cpp's snapshots (docs/speculative.md#hybrid-models): a conversation of three turns, the first ended by
// a stop string (inside a draft, its rollback pending) and another conversation taking the only slot before the
// third, answers what a server that never drafts answers.
test('tiny-hybrid: drafted turns, a stop string and a parked conversation answer as without drafting', async () => {
    const args = ['-c', '4096', '-np', '1'];
    const hybrid = await startServer([...args, '--spec-draft-fixed'], { preset: 'tiny-hybrid' });
    const none = await startServer([...args, '--spec-type', 'none'], { preset: 'tiny-hybrid' });
    try {
        // llama-server's /completion, raw prompts: the Qwen3.5 template would make every answer reasoning.
        const complete = (on, prompt, extra = {}) => post(on.url, '/completion',
            { prompt, temperature: 0, n_predict: 48, ...extra });
        const whole = (await complete(none, loopText)).content;
        assert.ok(whole.length > 20, `too little text to pick a stop string from: ${JSON.stringify(whole)}`);
        const stop = whole.slice(Math.floor(whole.length / 2), Math.floor(whole.length / 2) + 6);
        const conversation = async (on) => {
            const a1 = await complete(on, loopText, { stop: [stop] });
            const second = `${loopText}${a1.content}\n${countText}`;
            const a2 = await complete(on, second);
            const other = await complete(on, repeated('north south east west', 16));  // takes the only slot
            const a3 = await complete(on, `${second}${a2.content}\n${loopText}`);
            return [a1, a2, other, a3];
        };
        const drafted = await conversation(hybrid);
        const plainAnswers = await conversation(none);
        drafted.forEach((a, i) => {
            assert.equal(a.content, plainAnswers[i].content, `turn ${i}`);
            assert.equal(a.stop_type, plainAnswers[i].stop_type, `turn ${i}`);
            assert.equal(plainAnswers[i].timings?.draft_n, undefined, `turn ${i}: --spec-type none drafts nothing`);
        });
        assert.equal(drafted[0].stop_type, 'word', 'the first answer ended at the stop string');
        const draftN = drafted.reduce((n, a) => n + (a.timings?.draft_n ?? 0), 0);
        const accepted = drafted.reduce((n, a) => n + (a.timings?.draft_n_accepted ?? 0), 0);
        assert.ok(accepted > 0 && draftN > 0, `drafts verified ${draftN}, accepted ${accepted}`);
        assert.ok(drafted[3].tokens_cached > 0, 'the last turn reused the conversation');
    } finally {
        await Promise.all([hybrid.stop(), none.stop()]);
    }
});
