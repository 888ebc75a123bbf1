// `keepwarm proxy` in front of upstreams that lie, hang or die (issue 14, cases 4 and 9): a Node stand-in upstream
// answers with hostile streams in each dialect (tool call and content block indices of -1, 2^64-1 and 99,999,999,
// JSON nested 100,000 deep, a line without end, an answer without end), accepts a request and never answers, stops
// in the middle of an answer, dies in the middle of a /v1/completions stream, sends only keep-alive comments, or answers
// with a redirect (issue 39). Each time the client gets a clean error in its API's shape, the proxy stays up and small,
// and the next request to a good upstream completes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { startProcess, waitFor } from './harness.mjs';

// What the stand-in does with the next answers; 'good' answers every dialect properly.
let mode = 'good';
const hung = new Set(); // responses held open by the hanging modes, ended in after()

const sse = (data, event) => `${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;
const chunk = (delta, extra = {}) => sse({ choices: [{ index: 0, delta, ...extra }] });
const ndjson = (line) => `${JSON.stringify(line)}\n`;
const toolIndex = (index) =>
    `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":${index},"id":"c1","function":{"name":"f","arguments":"{}"}}]}}]}\n\n`;
const deep = (n) => '['.repeat(n) + ']'.repeat(n);

const good = {
    '/v1/chat/completions': () =>
        chunk({ role: 'assistant', content: 'fine' }) +
        chunk({}, { finish_reason: 'stop' }) +
        sse({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 1 } }) +
        'data: [DONE]\n\n',
    '/v1/messages': () =>
        sse({ type: 'message_start', message: { usage: { input_tokens: 3, output_tokens: 0 } } }, 'message_start') +
        sse({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }, 'content_block_start') +
        sse({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'fine' } }, 'content_block_delta') +
        sse({ type: 'content_block_stop', index: 0 }, 'content_block_stop') +
        sse({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 1 } }, 'message_delta') +
        sse({ type: 'message_stop' }, 'message_stop'),
    '/api/chat': () =>
        ndjson({ message: { role: 'assistant', content: 'fine' }, done: false }) +
        ndjson({ message: { role: 'assistant', content: '' }, done: true, prompt_eval_count: 3, eval_count: 1 }),
    '/v1/completions': () => sse({ choices: [{ index: 0, text: 'fine' }] }) + 'data: [DONE]\n\n',
};

// Writes `piece` until the client (the proxy) goes, with backpressure: an answer that never ends.
function endless(res, piece) {
    let open = true;
    res.on('close', () => (open = false));
    const more = () => {
        while (open && res.write(piece));
        if (open) res.once('drain', more);
    };
    more();
}

const hostile = {
    'tool index -1': (res) => res.end(toolIndex(-1) + 'data: [DONE]\n\n'),
    'tool index 2^64-1': (res) => res.end(toolIndex('18446744073709551615') + 'data: [DONE]\n\n'),
    'tool index 99,999,999': (res) => res.end(toolIndex(99999999) + 'data: [DONE]\n\n'),
    'content block -1': (res) =>
        res.end(
            sse({ type: 'message_start', message: { usage: { input_tokens: 3 } } }, 'message_start') +
                sse({ type: 'content_block_start', index: -1, content_block: { type: 'tool_use', id: 't', name: 'f' } },
                    'content_block_start'),
        ),
    'deep tool arguments': (res) =>
        res.end(`{"message":{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":${deep(100000)}}}}]},"done":false}\n`),
    'a line without end': (res) => endless(res, '{"message":{"content":"' + 'x'.repeat(65536)),
    'an answer without end': (res) => endless(res, chunk({ content: 'y'.repeat(65536) })),
    'head then silence': (res) => {
        res.write(chunk({ role: 'assistant', content: 'part' }));
        hung.add(res);
    },
    pings: (res) => {
        const timer = setInterval(() => res.write(': ping\n\n'), 100);
        res.on('close', () => clearInterval(timer));
    },
    'dies mid-answer': (res) => {
        res.write(sse({ choices: [{ index: 0, text: 'half' }] }));
        setTimeout(() => res.socket.destroy(), 50);
    },
};

const upstream = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
        if (mode === 'hang everything' || (mode === 'hang' && req.method === 'POST')) return hung.add(res);
        if (req.method === 'GET') {
            res.writeHead(200, { 'content-type': 'application/json' });
            const listing = req.url === '/api/tags' ? { models: [{ name: 'stand-in' }] }
                : { object: 'list', data: [{ id: 'stand-in', object: 'model', owned_by: 'test' }] };
            return res.end(JSON.stringify(listing));
        }
        if (mode === 'redirect') {
            res.writeHead(302, { location: 'http://elsewhere.example/v1/chat/completions' });
            return res.end();
        }
        const ndjsonAnswer = req.url === '/api/chat';
        res.writeHead(200, { 'content-type': ndjsonAnswer ? 'application/x-ndjson' : 'text/event-stream' });
        if (mode === 'good') return res.end(good[req.url]());
        hostile[mode](res);
    });
});

async function startProxy(dialect, extra = []) {
    const url = `http://127.0.0.1:${upstream.address().port},dialect=${dialect}`;
    const proxy = await startProcess(['proxy', '--port', '0', '--upstream', url, '--health-interval', '0.2', ...extra]);
    return { ...proxy, log: proxy.output };
}

const proxies = {};
before(async () => {
    await new Promise((resolve) => upstream.listen(0, '127.0.0.1', resolve));
    // The OpenAI proxy's 1 s timeouts are what the hung and silent upstreams below trip. The other two serve only
    // hostile streams, where a timeout is never the answer: a minute, so that on a loaded machine a line without end
    // reaches its length limit before the first-byte timeout (it did not within 1 s).
    const timeouts = ['--first-byte-timeout', '1', '--upstream-idle-timeout', '1'];
    const generous = ['--first-byte-timeout', '60', '--upstream-idle-timeout', '60'];
    for (const dialect of ['openai', 'anthropic', 'ollama']) {
        proxies[dialect] = await startProxy(dialect, dialect === 'openai' ? timeouts : generous);
    }
});
after(async () => {
    for (const res of hung) res.destroy();
    for (const p of Object.values(proxies)) {
        p.proc.removeAllListeners('exit');
        p.proc.kill('SIGTERM');
    }
    upstream.closeAllConnections();
    await new Promise((resolve) => upstream.close(resolve));
});

async function post(proxy, path, body) {
    const res = await fetch(`${proxy.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
    });
    return { status: res.status, text: await res.text() };
}

const chat = (proxy, stream) =>
    post(proxy, '/v1/chat/completions', { model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, stream });

function rssMiB(proxy) {
    const status = readFileSync(`/proc/${proxy.proc.pid}/status`, 'utf8');
    return Number(status.match(/VmRSS:\s+(\d+)/)[1]) / 1024;
}

// The proxy is up, still small, takes its upstream back once the health check sees it answer, and serves the next
// request completely.
async function servesTheNextRequest(proxy) {
    mode = 'good';
    assert.equal(proxy.proc.exitCode, null, 'the proxy is still running');
    assert.equal(proxy.proc.signalCode, null, 'the proxy is still running');
    assert.ok(rssMiB(proxy) < 512, `the proxy holds ${rssMiB(proxy)} MiB`);
    const up = await waitFor(async () => (await fetch(`${proxy.url}/health`)).status === 200);
    assert.ok(up, 'the upstream is back in routing');
    const { status, text } = await chat(proxy, false);
    assert.equal(status, 200, text);
    assert.equal(JSON.parse(text).choices[0].message.content, 'fine');
}

// A streamed answer that ends with the proxy's error event (then [DONE]) naming `says`.
function assertErrorEvent(status, text, says) {
    assert.equal(status, 200, text);
    const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
    assert.equal(events.at(-1), '[DONE]', text.slice(-300));
    const error = JSON.parse(events.at(-2)).error;
    assert.ok(error, `no error event: ${text.slice(-300)}`);
    assert.match(error.message, says);
}

for (const [name, says] of [
    ['tool index -1', /tool call index -1/],
    ['tool index 2^64-1', /tool call index 18446744073709551615/],
    ['tool index 99,999,999', /tool call index 99999999/],
    ['an answer without end', /answer is over/],
]) {
    test(`an OpenAI-dialect upstream sending ${name}: an error event, a 500 for a whole answer`, async () => {
        const proxy = proxies.openai;
        mode = name;
        const streamed = await chat(proxy, true);
        assertErrorEvent(streamed.status, streamed.text, says);
        mode = name;
        const whole = await chat(proxy, false);
        assert.equal(whole.status, 500, whole.text);
        assert.match(JSON.parse(whole.text).error.message, says);
        await servesTheNextRequest(proxy);
    });
}

test('an Anthropic-dialect upstream starting content block -1: an error event in each client API', async () => {
    const proxy = proxies.anthropic;
    mode = 'content block -1';
    const openai = await chat(proxy, true);
    assertErrorEvent(openai.status, openai.text, /content block -1/);
    mode = 'content block -1';
    const anthropic = await post(proxy, '/v1/messages', {
        model: 'm', max_tokens: 4, stream: true, messages: [{ role: 'user', content: 'hi' }],
    });
    assert.equal(anthropic.status, 200);
    assert.match(anthropic.text, /event: error\ndata: .*content block -1/);
    await servesTheNextRequest(proxy);
});

for (const [name, says] of [
    ['deep tool arguments', /nested over/],
    ['a line without end', /bytes without ending a line/],
]) {
    test(`an Ollama-dialect upstream sending ${name}: a clean error in the Ollama API too`, async () => {
        const proxy = proxies.ollama;
        mode = name;
        const streamed = await chat(proxy, true);
        assertErrorEvent(streamed.status, streamed.text, says);
        mode = name;
        const ollama = await post(proxy, '/api/chat', { model: 'm', messages: [{ role: 'user', content: 'hi' }] });
        assert.equal(ollama.status, 200);
        const last = JSON.parse(ollama.text.trim().split('\n').at(-1));
        assert.match(last.error, says);
        await servesTheNextRequest(proxy);
    });
}

test('a hung upstream: a 504 that says the request was sent, and it is out of routing until it answers', async () => {
    const proxy = proxies.openai;
    mode = 'hang everything';
    const start = Date.now();
    const { status, text } = await chat(proxy, true);
    assert.ok(Date.now() - start < 30_000, `answered after ${Date.now() - start} ms`); // the upstream never would
    assert.equal(status, 504, text);
    const { message } = JSON.parse(text).error;
    assert.match(message, /was sent and no answer came in 1 s \(first-byte timeout\)/);
    assert.doesNotMatch(message, /sending the request/);
    // Out of routing at once (its health checks hang too): the next request is not sent to it.
    const health = await fetch(`${proxy.url}/health`);
    assert.equal(health.status, 503);
    assert.equal((await chat(proxy, false)).status, 503);
    assert.match(proxy.log(), /is down \(it timed out\)/);
    for (const res of hung) res.destroy();
    hung.clear();
    await servesTheNextRequest(proxy);
});

test('an upstream that stops mid-answer: an error event that names the idle timeout', async () => {
    const proxy = proxies.openai;
    mode = 'head then silence';
    const { status, text } = await chat(proxy, true);
    assert.match(text, /"content":"part"/);
    assertErrorEvent(status, text, /nothing came for 1 s \(idle timeout\)/);
    for (const res of hung) res.destroy();
    hung.clear();
    await servesTheNextRequest(proxy);
});

test('a /v1/completions stream whose upstream dies mid-answer ends with an error event, not a clean end', async () => {
    const proxy = proxies.openai;
    mode = 'dies mid-answer';
    const { status, text } = await post(proxy, '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 4, stream: true });
    assert.match(text, /"text":"half"/);
    assertErrorEvent(status, text, /upstream/);
    await servesTheNextRequest(proxy);
    mode = 'good';
    const again = await post(proxy, '/v1/completions', { model: 'm', prompt: 'hi', max_tokens: 4, stream: true });
    assert.equal(again.status, 200);
    assert.ok(again.text.endsWith('data: [DONE]\n\n'), again.text);
    assert.doesNotMatch(again.text, /"error"/);
});

test('an upstream that only sends keep-alive comments: a 504 for a whole answer, an error event for a stream', async () => {
    const proxy = proxies.openai;
    mode = 'pings';
    const start = Date.now();
    const whole = await chat(proxy, false);
    assert.ok(Date.now() - start < 30_000, `answered after ${Date.now() - start} ms`); // the upstream never would
    assert.equal(whole.status, 504, whole.text);
    assert.match(JSON.parse(whole.text).error.message, /sent no content in 1 s .*keep-alive comments are not progress/);
    mode = 'pings';
    const streamed = await chat(proxy, true);
    assertErrorEvent(streamed.status, streamed.text, /keep-alive comments are not progress/);
    await servesTheNextRequest(proxy);
});

test('an upstream that answers with a redirect: a 502 that names it, not a stream that ended early', async () => {
    const proxy = proxies.openai;
    mode = 'redirect';
    const { status, text } = await chat(proxy, false);
    assert.equal(status, 502, text);
    assert.match(
        JSON.parse(text).error.message,
        /answered 302 redirect to http:\/\/elsewhere\.example\/v1\/chat\/completions; keepwarm does not follow redirects/,
    );
    await servesTheNextRequest(proxy);
});
