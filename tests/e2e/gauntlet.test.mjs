// `keepwarm bench gauntlet` end to end: a tiny generated workload with every cache killer on, replayed against a
// keepwarm the bench launches itself (policy and prefix cache on, restarted once), with JSON and HTML written; the
// workload file round trip against a running server (--target); and clear errors for bad input.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { binary, startServer, testModel, tempDir } from './harness.mjs';

// Runs keepwarm and resolves with { code, stdout, stderr } whatever the exit status.
function keepwarm(args, timeout = 120_000) {
    return new Promise((resolve) => {
        execFile(binary, args, { timeout, maxBuffer: 64 << 20 }, (error, stdout, stderr) =>
            resolve({ code: error ? error.code : 0, stdout, stderr }));
    });
}

// A tiny workload: a 512-token system prompt, 4 tools, short answers and tool results.
function tiny({ agents = 2, turns = 2 } = {}) {
    return ['--system-tokens', '512', '--tools', '4', '--agents', String(agents), '--turns', String(turns),
            '--tool-rounds', '1', '--answer-tokens', '8', '--tool-result-tokens', '100'];
}

test('a launched keepwarm through every killer: per-request numbers, ideal, JSON and HTML', async () => {
    const model = await testModel('tiny');
    const dir = tempDir('gauntlet');
    const json = path.join(dir, 'report.json');
    const html = path.join(dir, 'report.html');
    const r = await keepwarm(['bench', 'gauntlet', ...tiny(), '--killers', 'all', '--ping-every', '1', '--launch',
                              '--servers', 'keepwarm', '-m', model, '-c', '8192', '--parallel', '2', '-t', '1',
                              '--work-dir', path.join(dir, 'work'), '--json', json, '--html', html]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /gauntlet: started keepwarm/);
    assert.match(r.stderr, /gauntlet: keepwarm agent-1 line \d+: TTFT \d+ ms/);
    assert.match(r.stderr, /gauntlet: restarting keepwarm/);
    assert.match(r.stdout, /^target +reqs/m);

    const report = JSON.parse(readFileSync(json, 'utf8'));
    assert.equal(report.agents, 2);
    assert.match(report.killers, /cch,request-id,ping,model,num-ctx,cancel,restart,reasoning/);
    const [summary] = report.targets;
    assert.equal(summary.target, 'keepwarm');
    // 2 agents x 2 turns x (user request + 1 tool round) + 1 continuation of a cancelled answer per agent.
    assert.equal(summary.requests, 10);
    assert.equal(summary.failures, 0, readFileSync(json, 'utf8'));
    assert.ok(summary.pings >= 1);
    assert.ok(summary.ideal_tokens > 0 && summary.computed_tokens >= summary.ideal_tokens * 0.9);
    assert.ok(summary.reused_tokens > 0, 'keepwarm reused the shared prefix');
    assert.ok(summary.cold_ttft_ms > 0 && summary.warm_ttft_p95_ms > 0);

    const requests = report.runs[0].requests;
    assert.equal(requests.filter((q) => q.restarted_before).length, 1);
    for (const q of requests.filter((q) => !q.ping)) {
        assert.ok(q.ttft_ms > 0 && q.total_ms >= q.ttft_ms, JSON.stringify(q));
        assert.ok(q.ideal_prompt_tokens > 0 && q.ideal_new_tokens >= 1, JSON.stringify(q));
        // The killers' nonces are in what was sent, not in the ideal's normalized prompt.
        if (q.prompt_tokens >= 0) {
            assert.equal(q.reused_tokens + q.computed_tokens, q.prompt_tokens, JSON.stringify(q));
            assert.ok(q.prompt_tokens > q.ideal_prompt_tokens, JSON.stringify(q));
        } else {
            assert.ok(q.cancelled, `only a cancelled stream goes without numbers: ${JSON.stringify(q)}`);
        }
    }
    // Each agent's first request sees nothing it could reuse from itself; a later turn reuses most of its prompt.
    const warm = requests.filter((q) => !q.ping && q.agent_request > 0 && q.prompt_tokens > 0 && !q.restarted_before);
    assert.ok(warm.some((q) => q.reused_tokens > q.prompt_tokens / 2), JSON.stringify(warm));
    // The policy absorbs pings: no engine, nothing computed.
    for (const q of requests.filter((q) => q.ping)) assert.equal(q.computed_tokens, 0, JSON.stringify(q));

    const page = readFileSync(html, 'utf8');
    assert.match(page, /<svg[^>]*>[\s\S]*TTFT per request over time/);
    assert.match(page, /Prefill tokens computed vs the ideal/);
    assert.match(page, /<td>keepwarm<\/td>/);
    assert.doesNotMatch(page, /<script|https?:\/\/(?!www\.w3\.org)/);
});

test('a written workload replays against a running server given by --target', async () => {
    const model = await testModel('tiny');
    const dir = tempDir('gauntlet');
    const file = path.join(dir, 'workload.jsonl');
    const generated = await keepwarm(['bench', 'gauntlet', ...tiny({ agents: 1, turns: 1 }), '--api',
                                      'openai', '--killers', 'cch,model', '--generate', file]);
    assert.equal(generated.code, 0, generated.stderr);
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    assert.equal(lines.length, 2);
    assert.equal(lines[0].api, 'openai');
    assert.match(lines[0].body.messages[0].content, /^x-anthropic-billing-header: .*cch=[0-9a-f]{5};\n/);

    // --no-policy: the built-in defaults would keep the nonce out, and this checks what the ideal is measured against.
    const server = await startServer(['--parallel', '1', '-c', '4096', '--no-policy']);
    try {
        const json = path.join(dir, 'report.json');
        const r = await keepwarm(['bench', 'gauntlet', '--workload', file, '-m', model, '--target',
                                  `kw=${server.url},api=openai`, '--json', json]);
        assert.equal(r.code, 0, r.stderr);
        const report = JSON.parse(readFileSync(json, 'utf8'));
        const [summary] = report.targets;
        assert.equal(summary.target, 'kw');
        assert.equal(summary.requests, 2);
        assert.equal(summary.failures, 0);
        // The tool round's request extends the first one, but its cch= nonce is new: a server without the policy
        // reuses only what comes before the nonce, while the ideal (nonce removed) finds nearly all of it known.
        const [first, second] = report.runs[0].requests;
        assert.equal(first.reused_tokens, 0);
        assert.ok(second.reused_tokens > 0 && second.reused_tokens < 60, JSON.stringify(second));
        assert.ok(second.ideal_new_tokens < second.ideal_prompt_tokens / 2, JSON.stringify(second));
        assert.ok(summary.computed_over_ideal > 1.5, JSON.stringify(summary));
    } finally {
        await server.stop();
    }
});

// The uuid and clock killers against keepwarm's built-in defaults (no --policy): the request id and the time are moved
// after the cached prefix and their notes come back in the history, so the server computes about what a perfect
// cache would; without a policy each request recomputes from the start of the system prompt.
for (const killer of ['request-id', 'clock']) {
    test(`the ${killer} killer with the built-in defaults: computed / ideal at most 1.2`, async () => {
        const model = await testModel('tiny');
        const dir = tempDir('gauntlet');
        const file = path.join(dir, 'workload.jsonl');
        const generated = await keepwarm(['bench', 'gauntlet', '--system-tokens', '2048', '--tools', '4', '--agents',
                                          '2', '--turns', '3', '--tool-rounds', '1', '--answer-tokens', '8',
                                          '--tool-result-tokens', '100', '--api', 'openai', '--killers', killer,
                                          '--generate', file]);
        assert.equal(generated.code, 0, generated.stderr);
        const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
        const injected = killer === 'clock' ? /^Current time: 2026-12-06 [0-9:]{8}\n$/ : /^request-id: [0-9a-f-]{36}\n$/;
        for (const line of lines) assert.match(line.injected.system_prefix, injected);
        assert.notEqual(lines[0].injected.system_prefix, lines[1].injected.system_prefix);

        const ratios = {};
        for (const [name, args] of [['defaults', []], ['none', ['--no-policy']]]) {
            const server = await startServer(['--parallel', '1', '-c', '8192', ...args]);
            try {
                const json = path.join(dir, `${name}.json`);
                const r = await keepwarm(['bench', 'gauntlet', '--workload', file, '-m', model, '--target',
                                          `kw=${server.url},api=openai`, '--json', json], 300_000);
                assert.equal(r.code, 0, r.stderr);
                const [summary] = JSON.parse(readFileSync(json, 'utf8')).targets;
                assert.equal(summary.failures, 0, JSON.stringify(summary));
                ratios[name] = summary.computed_over_ideal;
            } finally {
                await server.stop();
            }
        }
        assert.ok(ratios.defaults <= 1.2, JSON.stringify(ratios));
        assert.ok(ratios.none > 1.5, JSON.stringify(ratios));
    });
}

test('bad workloads, targets and options get a clear error', async () => {
    const dir = tempDir('gauntlet');
    const file = path.join(dir, 'bad.jsonl');
    writeFileSync(file, '{"agent":"a","api":"openai","body":{"messages":[]}}\n{"agent":"a","api":"openai"}\n');
    const bad = await keepwarm(['bench', 'gauntlet', '--workload', file, '--target', 'x=http://127.0.0.1:9']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /bad\.jsonl: line 2: 'body' must be a JSON object/);

    const target = await keepwarm(['bench', 'gauntlet', '--target', 'http://127.0.0.1:9']);
    assert.equal(target.code, 1);
    assert.match(target.stderr, /must be NAME=URL/);
    const killers = await keepwarm(['bench', 'gauntlet', '--killers', 'cch,nonce', '--generate', '/dev/null']);
    assert.equal(killers.code, 1);
    assert.match(killers.stderr, /unknown cache killer 'nonce'/);
    const launch = await keepwarm(['bench', 'gauntlet', '--launch']);
    assert.equal(launch.code, 1);
    assert.match(launch.stderr, /--launch needs --model and --ctx-size/);
    const mismatch = await keepwarm(['bench', 'gauntlet', '--api', 'anthropic', '--killers', 'none', '--turns', '1',
                                     '--agents', '1', '--target', 'x=http://127.0.0.1:9,api=openai']);
    assert.equal(mismatch.code, 1);
    assert.match(mismatch.stderr, /for the anthropic API, but target x speaks only openai/);
});
