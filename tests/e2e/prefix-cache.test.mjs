// The prefix cache seen from outside: per-response accounting by tier, GET /v1/cache, a restart that picks up the
// disk tier, damaged disk entries reported and ignored, and a kill -9 during disk writes that loads nothing bad.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, writeFileSync, truncateSync, statSync } from 'node:fs';
import path from 'node:path';
import { startServer, curl, metrics, waitFor, words } from './harness.mjs';

const servers = [];
after(async () => {
    for (const s of servers) await s.stop();
});

async function start(args, options) {
    const s = await startServer(args, options);
    servers.push(s);
    return s;
}

function chat(system, user) {
    return {
        model: 'any',
        temperature: 0,
        max_tokens: 4,
        messages: [
            { role: 'system', content: system },
            { role: 'user', content: user },
        ],
    };
}

async function complete(server, body) {
    const res = await curl(`${server.url}/v1/chat/completions`, { method: 'POST', body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body;
}

const kwkvFiles = (dir) => readdirSync(dir).filter((f) => f.endsWith('.kwkv'));

test('responses say which tier the reused tokens came from, and /v1/cache lists the tiers', async () => {
    const server = await start(['--parallel', '1', '--cache-parked', '0', '--cache-block', '32']);
    const a = chat(words(300, 1), 'first question');
    const b = chat(words(300, 2), 'second question');
    const cold = await complete(server, a);
    assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(cold.usage.prompt_tokens_details.computed_tokens, cold.usage.prompt_tokens);

    const warm = await complete(server, a);
    assert.equal(warm.timings.cache_device_n, warm.usage.prompt_tokens - 1, 'same prompt: all but the last token');
    assert.equal(warm.usage.prompt_tokens_details.cached_tokens_device, warm.usage.prompt_tokens - 1);
    assert.ok(warm.timings.setup_ms >= 0 && warm.timings.setup_ms < 1000, `setup_ms ${warm.timings.setup_ms}`);

    await complete(server, b); // the only slot takes B; with no parked sequences A goes to RAM blocks
    const fromRam = await complete(server, a);
    assert.ok(fromRam.timings.cache_ram_n >= 32, JSON.stringify(fromRam.timings));
    assert.equal(
        fromRam.timings.cache_n,
        fromRam.timings.cache_device_n + fromRam.timings.cache_ram_n + fromRam.timings.cache_disk_n,
    );

    const res = await curl(`${server.url}/v1/cache`);
    assert.equal(res.status, 200);
    const cache = res.body;
    for (const tier of ['device', 'ram', 'disk']) {
        for (const key of ['entries', 'bytes', 'budget_bytes', 'hits', 'evictions']) {
            assert.equal(typeof cache.tiers[tier][key], 'number', `${tier}.${key}`);
        }
    }
    assert.ok(cache.tiers.ram.bytes > 0 && cache.tiers.ram.hits >= 1);
    assert.ok(cache.hits >= 2 && cache.misses >= 1, JSON.stringify(cache));
    assert.match(server.output(), /reused \d+: .*\d+ ram/);
});

test('the log shows where a prompt departs from the cached one (its text with --log-prompts)', async () => {
    const server = await start(['--parallel', '1', '--log-prompts']);
    const system = words(200, 3);
    await complete(server, chat(system + ' version one of the rules', 'hello'));
    await complete(server, chat(system + ' version two of the rules', 'hello'));
    assert.ok(
        await waitFor(() => /diverged at token \d+: ".*" \+ ".*" where the cache has ".*"/.test(server.output())),
        server.output(),
    );
});

test('a restarted server restores from disk; damaged entries are reported and never loaded', async () => {
    const first = await start(['--parallel', '1', '--cache-block', '32']);
    const body = chat(words(400, 4), 'a question that will come back');
    const cold = await complete(first, body);
    await first.stop(); // SIGTERM: the device tier is written to disk before exit
    assert.ok(kwkvFiles(first.cacheDir).length > 0, 'disk entries written at shutdown');

    const second = await start(['--parallel', '1', '--cache-block', '32'], { cacheDir: first.cacheDir });
    const warm = await complete(second, body);
    assert.ok(warm.timings.cache_disk_n >= cold.usage.prompt_tokens - 64, JSON.stringify(warm.timings));
    assert.deepEqual(warm.choices[0].message, cold.choices[0].message);
    await second.stop();

    // Flip a payload byte in one entry, truncate another, and drop a file of another "model" in.
    const files = kwkvFiles(first.cacheDir).map((f) => path.join(first.cacheDir, f));
    assert.ok(files.length >= 2);
    const bytes = readFileSync(files[0]);
    bytes[bytes.length - 5] ^= 0xff;
    writeFileSync(files[0], bytes);
    truncateSync(files[1], Math.floor(statSync(files[1]).size / 2));
    const third = await start(['--parallel', '1', '--cache-block', '32'], { cacheDir: first.cacheDir });
    const cache = (await curl(`${third.url}/v1/cache`)).body;
    assert.ok(cache.disk_rejected >= 2, JSON.stringify(cache));
    assert.match(third.output(), /disk cache: ignored/);
    const after = await complete(third, body);
    assert.equal(after.usage.prompt_tokens, cold.usage.prompt_tokens);
    assert.equal((await curl(`${third.url}/v1/cache`)).body.restore_failures, 0);
});

// The next turn of `body` after `answer`: its history, the answer as the client got it, and a new question.
function nextTurn(body, answer, question) {
    return { ...body, messages: [...body.messages, { role: 'assistant', content: answer }, { role: 'user', content: question }] };
}

// Exact counts: a conversation's next turn reuses as many tokens after its cells were demoted to RAM (a short one,
// less than a block) or after a restart as on a server where they stayed on the device: all of the last prompt,
// and the answer's tokens as far as the next turn renders them the same.
test('a demotion and a restart lose no cached token: the next turn computes only what is new', async () => {
    const args = ['--parallel', '1', '--cache-parked', '0'];
    // What the next turn reuses on a server that kept the conversation on the device.
    const undisturbed = async (body, question) => {
        const server = await start(args);
        const first = await complete(server, body);
        const next = await complete(server, nextTurn(body, first.choices[0].message.content, question));
        return { first, cached: next.usage.prompt_tokens_details.cached_tokens };
    };

    const short = chat(words(90, 11), 'a short question');
    const shortBaseline = await undisturbed(short, 'and a follow-up');
    const prompt = shortBaseline.first.usage.prompt_tokens;
    // Shorter than a block; longer than the few tokens a slot drops rather than keeps (64).
    assert.ok(prompt > 64 && prompt < 256, `${prompt} tokens`);
    assert.ok(shortBaseline.cached >= prompt, `the device keeps all of the last prompt: ${shortBaseline.cached}`);
    const demoting = await start(args);
    const first = await complete(demoting, short);
    await complete(demoting, chat(words(60, 12), 'another conversation takes the only slot'));
    const next = await complete(demoting, nextTurn(short, first.choices[0].message.content, 'and a follow-up'));
    assert.equal(next.usage.prompt_tokens_details.cached_tokens, shortBaseline.cached, JSON.stringify(next.timings));
    // From RAM, but for the few tokens the other conversation's template opening shares on the device.
    assert.equal(next.timings.cache_ram_n + next.timings.cache_device_n, shortBaseline.cached);
    assert.ok(next.timings.cache_ram_n > 64, JSON.stringify(next.timings));

    const long = chat(words(400, 13), 'a question before the restart');
    const longBaseline = await undisturbed(long, 'and after it');
    assert.notEqual(longBaseline.first.usage.prompt_tokens % 256, 0, 'the prompt ends inside a block');
    const server = await start(args);
    const before = await complete(server, long);
    await server.stop(); // SIGTERM: whole blocks and the tails past them go to disk
    const restarted = await start(args, { cacheDir: server.cacheDir });
    const after = await complete(restarted, nextTurn(long, before.choices[0].message.content, 'and after it'));
    assert.equal(after.usage.prompt_tokens_details.cached_tokens, longBaseline.cached, JSON.stringify(after.timings));
    assert.equal(after.timings.cache_disk_n, longBaseline.cached, 'all of it from disk');
    // The same prompt again after a restart: all but its last token from disk, the tail written at shutdown included
    // (issue 33: it stopped at the last whole block).
    await restarted.stop();
    const again = await start(args, { cacheDir: server.cacheDir });
    const same = await complete(again, long);
    const expected = before.usage.prompt_tokens - 1;
    assert.equal(same.usage.prompt_tokens_details.cached_tokens, expected, JSON.stringify(same.timings));
    assert.equal(same.timings.cache_disk_n, expected, 'all of it from disk');
});

// An agent sends each answer back in the next turn's history as it got it: the content, with the whitespace around
// it trimmed and invalid UTF-8 replaced. That text must map to the tokens the model wrote, which the KV cache holds,
// in the same run and after a restart (the prompt tokenizer's index is saved beside the disk tier). A random model's
// answers are random tokens: re-tokenizing their text almost never gives the same ids.
test('answers carried back reuse the tokens the model wrote, in the same run and after a restart', async () => {
    const args = ['--parallel', '1', '--cache-block', '16'];
    const server = await start(args);
    const first = (i) => ({
        model: 'any',
        temperature: 1,
        seed: i,
        max_tokens: 40,
        messages: [
            { role: 'system', content: words(120, 50 + i) },
            { role: 'user', content: `question ${i}` },
        ],
    });
    const second = (i, answer) => {
        const body = first(i);
        body.max_tokens = 2;
        body.messages.push({ role: 'assistant', content: answer.choices[0].message.content ?? '' });
        body.messages.push({ role: 'user', content: 'go on' });
        return body;
    };
    const held = (answer) => answer.usage.prompt_tokens + answer.usage.completion_tokens - 1; // KV cells it left
    for (let i = 0; i < 8; i++) {
        const answer = await complete(server, first(i));
        const next = await complete(server, second(i, answer));
        const reused = next.usage.prompt_tokens_details.cached_tokens;
        assert.ok(reused >= held(answer), `conversation ${i}: reused ${reused} of the ${held(answer)} cached`);
    }
    const index = (await curl(`${server.url}/v1/cache`)).body.prompt_index;
    assert.ok(index.answers_delivered_differently >= 1, `some answer reached the client trimmed: ${JSON.stringify(index)}`);
    const m = await metrics(server.url);
    assert.equal(m.keepwarm_answers_delivered_differently_total, index.answers_delivered_differently);
    assert.equal(m.keepwarm_prompt_index_tokens, index.tokens_held);

    const answers = [];
    for (let i = 8; i < 14; i++) answers.push(await complete(server, first(i)));
    await server.stop();
    const restarted = await start(args, { cacheDir: server.cacheDir });
    assert.match(restarted.output(), /prompt index: \d+ tokens loaded/);
    for (let i = 8; i < 14; i++) {
        const answer = answers[i - 8];
        const next = await complete(restarted, second(i, answer));
        const reused = next.usage.prompt_tokens_details.cached_tokens;
        // The disk tier keeps whole blocks.
        const blocks = held(answer) - (held(answer) % 16);
        assert.ok(reused >= blocks, `conversation ${i}: reused ${reused} of the ${blocks} on disk after the restart`);
    }
});

// A client that leaves mid-answer keeps what was streamed and may send it back (to have it continued, or as
// history): the tokens it got whole are the ones the cache holds, even where the content was trimmed.
test('the part of an answer a client got before it left comes back as the tokens the model wrote', async () => {
    const server = await start(['--parallel', '1']);
    const question = (i) => [{ role: 'user', content: `question number ${i}, about ${words(20, 70 + i)}` }];
    for (let i = 0; i < 8; i++) {
        const counted = await complete(server, { model: 'any', max_tokens: 1, messages: question(i) });
        const controller = new AbortController();
        const stream = await server.client().chat.completions.create(
            { model: 'any', messages: question(i), temperature: 1, seed: i, max_tokens: 100000, ignore_eos: true,
              stream: true },
            { signal: controller.signal },
        );
        let partial = '';
        let chunks = 0;
        try {
            for await (const chunk of stream) {
                const text = chunk.choices[0]?.delta?.content ?? '';
                if (!text) continue;
                partial += text;
                if (++chunks === 12) {
                    controller.abort();
                    break;
                }
            }
        } catch {
            // The client may report the abort as an error; either way the connection is closed.
        }
        assert.ok(await waitFor(async () => (await curl(`${server.url}/health`)).body.slots_processing === 0));
        const next = await complete(server, {
            model: 'any',
            max_tokens: 2,
            messages: [...question(i), { role: 'assistant', content: partial }, { role: 'user', content: 'go on' }],
        });
        const reused = next.usage.prompt_tokens_details.cached_tokens;
        const prompt = counted.usage.prompt_tokens;
        assert.ok(reused >= prompt + 6, `conversation ${i}: reused ${reused}, the prompt alone is ${prompt} tokens`);
    }
    const index = (await curl(`${server.url}/v1/cache`)).body.prompt_index;
    assert.ok(index.answers_delivered_differently >= 1, `some answer reached the client trimmed: ${JSON.stringify(index)}`);
});

test('kill -9 during heavy disk writes: the next start loads only whole entries', async () => {
    const args = ['--parallel', '1', '--cache-parked', '0', '--cache-block', '16'];
    const server = await start(args);
    // Every new prompt pushes the previous one out of the only slot into RAM blocks, which are written to disk.
    const pending = [];
    for (let i = 0; i < 12; i++) pending.push(complete(server, chat(words(300, 100 + i), `q${i}`)).catch(() => null));
    assert.ok(await waitFor(() => kwkvFiles(server.cacheDir).length >= 20, { timeoutMs: 60_000 }));
    // Waited for: a process killed inside an fsync leaves only when it returns, and its cache folder's lock with it
    // (on a busy disk the restart below found the folder still locked).
    await server.stop('SIGKILL');
    await Promise.all(pending);

    const restarted = await start(args, { cacheDir: server.cacheDir });
    const cache = (await curl(`${restarted.url}/v1/cache`)).body;
    assert.equal(cache.disk_rejected, 0, 'an interrupted write leaves a temporary file, never a bad entry');
    assert.ok(cache.tiers.disk.entries > 0);
    assert.ok(!readdirSync(server.cacheDir).some((f) => f.includes('.tmp.')), 'temporary files removed');
    const res = await complete(restarted, chat(words(300, 100), 'q0'));
    assert.ok(res.usage.prompt_tokens > 0);
    assert.equal((await curl(`${restarted.url}/v1/cache`)).body.restore_failures, 0);
});
