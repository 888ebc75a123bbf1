// A recording proxy: forwards every request to a keepwarm server unchanged and keeps what the client sent (method,
// path, headers without credentials, body), so a real client's requests can be inspected and saved as fixtures.
//   node tests/e2e/capture-requests.mjs --target http://127.0.0.1:8080 --out /tmp/captured [--port 8081]
// writes one <NNN>-<path>.json per request; tests import startCapture() instead.
import http from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

const secretHeaders = new Set(['authorization', 'x-api-key', 'cookie']);

// The text, usage and finish reason of a streamed Chat Completions answer (an SSE body a capture recorded).
export function streamedChat(sse) {
    let text = '';
    let usage;
    let finish;
    for (const frame of sse.split('\n\n')) {
        const data = frame.split('\n').find((line) => line.startsWith('data: '));
        if (!data || data === 'data: [DONE]') continue;
        const chunk = JSON.parse(data.slice(6));
        usage = chunk.usage ?? usage;
        for (const c of chunk.choices ?? []) {
            text += c.delta?.content ?? '';
            finish = c.finish_reason ?? finish;
        }
    }
    return { text, usage, finish };
}

// Starts the proxy on a free port of 127.0.0.1. Resolves to { url, requests, close() }; `requests` fills as they come,
// each with `response` ({ status, body as text }) once its answer is complete. With `outDir`, each request (without
// its response) is also written there as JSON. With `rewrite(body, path)`, a JSON body is forwarded as that function
// returns it (the record keeps what the client sent): how a test steers a random-weight model a real client drives.
export async function startCapture(target, { outDir, port = 0, rewrite } = {}) {
    const requests = [];
    if (outDir) mkdirSync(outDir, { recursive: true });
    const server = http.createServer((req, res) => {
        const chunks = [];
        req.on('data', (c) => chunks.push(c));
        req.on('end', () => {
            const raw = Buffer.concat(chunks);
            let body = raw.toString('utf8');
            try {
                body = JSON.parse(body);
            } catch {
                // not JSON (or empty): kept as text
            }
            const headers = Object.fromEntries(Object.entries(req.headers).filter(([k]) => !secretHeaders.has(k)));
            const record = { method: req.method, path: req.url, headers, body };
            requests.push(record);
            if (outDir) {
                const name = `${String(requests.length).padStart(3, '0')}-${req.url.replace(/[^a-zA-Z0-9]+/g, '_')}.json`;
                writeFileSync(path.join(outDir, name), JSON.stringify(record, null, 2) + '\n');
            }
            let forwarded = raw;
            const headers_out = { ...req.headers };
            if (rewrite && typeof body === 'object') {
                forwarded = Buffer.from(JSON.stringify(rewrite(structuredClone(body), req.url)));
                headers_out['content-length'] = String(forwarded.length);
            }
            // A fresh connection per request: one bad response cannot confuse the next on a kept-alive socket.
            const upstream = http.request(new URL(req.url, target),
                { method: req.method, headers: headers_out, agent: false },
                (up) => {
                    res.writeHead(up.statusCode, up.headers);
                    const answer = [];
                    up.on('data', (c) => answer.push(c));
                    up.on('end', () => {
                        record.response = { status: up.statusCode, body: Buffer.concat(answer).toString('utf8') };
                    });
                    up.pipe(res);
                    // A client that leaves at its last event (Codex exits at response.completed) unpipes `up`, which
                    // then pauses before its end: read on, so that the whole answer is still recorded.
                    res.on('close', () => up.resume());
                });
            upstream.on('error', (e) => {
                // keepwarm answers HEAD with a body, which Node's client reports as an error after the response.
                if (res.headersSent) return res.end();
                res.writeHead(502, { 'content-type': 'application/json' });
                res.end(JSON.stringify({ type: 'error', error: { type: 'api_error', message: e.message } }));
            });
            upstream.end(forwarded);
        });
    });
    await new Promise((resolve) => server.listen(port, '127.0.0.1', resolve));
    return {
        url: `http://127.0.0.1:${server.address().port}`,
        requests,
        close: () => new Promise((resolve) => server.close(resolve)),
    };
}

if (import.meta.url === `file://${process.argv[1]}`) {
    const { values } = parseArgs({ options: { target: { type: 'string' }, out: { type: 'string' },
                                              port: { type: 'string', default: '0' } } });
    if (!values.target || !values.out) {
        console.error('usage: capture-requests.mjs --target URL --out DIR [--port N]');
        process.exit(2);
    }
    const capture = await startCapture(values.target, { outDir: values.out, port: Number(values.port) });
    console.log(`listening on ${capture.url}, forwarding to ${values.target}, writing to ${values.out}`);
}
