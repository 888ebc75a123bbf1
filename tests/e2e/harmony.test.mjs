// gpt-oss end to end (tiny-gpt-oss: alternating 128-token sliding-window and full layers, attention sinks, MoE, the
// harmony template): chat answers whole and streamed, a tool call round trip, the Responses API over several turns,
// and the cost of harmony to the prefix cache. The template drops an earlier answer's analysis channel from the
// history, so a next turn can reuse the prompt up to the previous answer and no further; keepwarm must reuse all of
// that, and recompute no more than the pinned llama-server on the same conversation.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { binary, curl, findLlamaServer, freePort, startServer, tempDir, testModel, waitFor } from './harness.mjs';

let server;
let openai;
before(async () => {
    server = await startServer(['-c', '8192', '-np', '1'], { preset: 'tiny-gpt-oss' });
    openai = server.client();
});
after(() => server?.stop());

const model = 'tiny-gpt-oss';
const filler = ['cache', 'prefix', 'token', 'agent', 'model', 'tool', 'the', 'of', 'and', 'to'];
// About 1,500 tokens: a dozen windows of the sliding-window layers.
const system = Array.from({ length: 1500 }, (_, i) => filler[(i * 7 + (i >> 3)) % filler.length]).join(' ');

async function tokenIds(text) {
    const { status, body } = await curl(`${server.url}/tokenize`, { method: 'POST', body: { content: text } });
    assert.equal(status, 200, JSON.stringify(body));
    return body.tokens;
}

async function singleToken(text) {
    const ids = await tokenIds(text);
    assert.equal(ids.length, 1, `${JSON.stringify(text)} is one token: ${ids}`);
    return ids[0];
}

test('a chat answer: the harmony prompt, and the same greedy text whole and streamed', async () => {
    const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Tell me about the sea.' }];
    const { body: rendered } = await curl(`${server.url}/apply-template`, { method: 'POST', body: { messages } });
    // The template writes harmony's system message itself; the request's system text is the developer message.
    assert.match(rendered.prompt, /^<\|start\|>system<\|message\|>.*Reasoning: medium/s);
    assert.match(rendered.prompt, /<\|start\|>developer<\|message\|># Instructions\n\nBe brief\.\n\n<\|end\|>/);
    assert.ok(rendered.prompt.endsWith('<|start|>user<|message|>Tell me about the sea.<|end|><|start|>assistant'),
              rendered.prompt.slice(-120));

    const params = { model, messages, temperature: 0, max_tokens: 12, ignore_eos: true };
    const whole = await openai.chat.completions.create(params);
    assert.equal(whole.usage.completion_tokens, 12);
    assert.equal(whole.choices[0].finish_reason, 'length');
    const text = (whole.choices[0].message.reasoning_content ?? '') + (whole.choices[0].message.content ?? '');
    assert.ok(text.length > 0, JSON.stringify(whole.choices[0].message));

    const stream = await openai.chat.completions.create({ ...params, stream: true });
    let content = '';
    let reasoning = '';
    for await (const chunk of stream) {
        content += chunk.choices[0]?.delta?.content ?? '';
        reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
    }
    assert.equal(content, whole.choices[0].message.content ?? '');
    assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
});

// A trailing assistant message is continued (llama-server's prefill): in the analysis channel while it has only
// reasoning, in the final channel once it has content. The harmony parser must put each channel in its own field.
// The whole message holds the prefill and its continuation; a stream sends the continuation (llama-server streams
// the prefill too), so the stream must be what the whole message adds to the prefill, or all of it.
test('a continued answer: the analysis channel comes back as reasoning_content, the final one as content', async () => {
    const user = { role: 'user', content: 'Hi' };
    const params = { model, temperature: 0, max_tokens: 8, ignore_eos: true };
    async function both(prefill) {
        const messages = [user, { role: 'assistant', ...prefill }];
        const whole = (await openai.chat.completions.create({ ...params, messages })).choices[0].message;
        const streamed = { content: '', reasoning_content: '' };
        for await (const chunk of await openai.chat.completions.create({ ...params, messages, stream: true })) {
            streamed.content += chunk.choices[0]?.delta?.content ?? '';
            streamed.reasoning_content += chunk.choices[0]?.delta?.reasoning_content ?? '';
        }
        for (const field of ['content', 'reasoning_content']) {
            const all = whole[field] ?? '';
            assert.ok(all === streamed[field] || all === prefill[field] + streamed[field],
                      `${field}: whole ${JSON.stringify(all)}, streamed ${JSON.stringify(streamed[field])}`);
        }
        return whole;
    }
    const thinking = await both({ reasoning_content: 'The user greets.', content: '' });
    assert.ok(thinking.reasoning_content.startsWith('The user greets.') &&
              thinking.reasoning_content.length > 'The user greets.'.length, JSON.stringify(thinking));
    assert.equal(thinking.content ?? '', '');

    const answering = await both({ reasoning_content: 'The user greets.', content: 'Hello' });
    assert.equal(answering.reasoning_content, 'The user greets.');
    assert.ok(answering.content.startsWith('Hello') && answering.content.length > 'Hello'.length,
              JSON.stringify(answering));
});

// Random weights never call a tool on their own. A required call makes the template's grammar write harmony's call
// header and arguments (`<|start|>assistant to=functions.NAME<|channel|>...<|message|>{...}<|call|>`), and a few
// biased tokens steer the model through it quickly: " to" (the recipient rather than a channel first), <|message|>
// (no content type), and the quote and brace that close the arguments. The grammar decides what may come; the bias
// only picks among what it allows.
test('a tool call round trip: a forced call parsed from harmony, its result back, the next turn reuses the prompt',
     async () => {
    const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const bias = {};
    bias[await singleToken(' to')] = 30;
    bias[await singleToken('<|message|>')] = 40;
    for (const t of ['"', '}', '"}']) bias[await singleToken(t)] = 50;
    const messages = [{ role: 'system', content: system }, { role: 'user', content: 'What is the weather in Paris?' }];
    const first = await openai.chat.completions.create({ model, messages, tools, tool_choice: 'required',
        temperature: 0, max_tokens: 100, logit_bias: bias });
    const choice = first.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.equal(typeof JSON.parse(call.function.arguments).city, 'string');

    messages.push(choice.message, { role: 'tool', tool_call_id: call.id, content: 'Sunny, 21 C' });
    // The history renders the call in the role header and the result as the function's message to the assistant.
    const { body: rendered } = await curl(`${server.url}/apply-template`, { method: 'POST', body: { messages } });
    const header = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>';
    assert.ok(rendered.prompt.includes(header), rendered.prompt.slice(-300));
    const args = rendered.prompt.slice(rendered.prompt.indexOf(header) + header.length);
    assert.match(args, /^\{"city": ?"[^"]*"\}<\|call\|>/);
    assert.ok(rendered.prompt.endsWith(
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny, 21 C"<|end|>' +
        '<|start|>assistant'), rendered.prompt.slice(-200));

    const second = await openai.chat.completions.create({ model, messages, tools, temperature: 0, max_tokens: 8,
                                                          ignore_eos: true });
    assert.equal(second.usage.completion_tokens, 8);
    // The whole first prompt, generation prompt included: the call re-renders from `<|start|>assistant` on.
    assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
              `cached ${second.usage.prompt_tokens_details.cached_tokens} of the first's ${first.usage.prompt_tokens}`);
});

// Codex's way: the whole conversation as input each turn, with the reasoning items it got back.
test('the Responses API over three turns: reasoning items in the input, each turn reuses the one before', async () => {
    const input = [{ role: 'user', content: [{ type: 'input_text', text: 'Tell me about the sea.' }] }];
    const params = { model, instructions: system, temperature: 0, max_output_tokens: 16 };
    let previous;
    for (const [i, question] of ['And the sky?', 'And rivers?', ''].entries()) {
        const r = await openai.responses.create({ ...params, input });
        assert.equal(r.object, 'response');
        assert.equal(r.status, 'incomplete');
        assert.equal(r.usage.output_tokens, 16);
        const message = r.output.find((item) => item.type === 'message');
        assert.ok(message, JSON.stringify(r.output));
        if (previous) {
            assert.ok(r.usage.input_tokens > previous.usage.input_tokens);
            assert.ok(r.usage.input_tokens_details.cached_tokens >= previous.usage.input_tokens,
                      `turn ${i + 1}: cached ${r.usage.input_tokens_details.cached_tokens} of the previous turn's ` +
                      `${previous.usage.input_tokens}`);
        }
        previous = r;
        if (!question) break;
        // What a real gpt-oss answers: its analysis channel as a reasoning item, then the final message.
        input.push({ type: 'reasoning', id: `rs_${i}`, summary: [],
                     content: [{ type: 'reasoning_text', text: `The user asks question ${i + 1}. Answer briefly.` }] },
                   { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: `Answer ${i + 1}.` }] },
                   { role: 'user', content: [{ type: 'input_text', text: question }] });
    }
});

// The pinned llama-server from bench/build-llama-server.sh: LLAMA_SERVER, else where that script leaves it.


// A conversation whose answers had reasoning: each turn appends the previous answer as a real gpt-oss would have
// given it (analysis in reasoning_content, the final channel in content) and a new user message. `ask(messages)`
// returns { prompt, cached } for one turn of `answer` generated tokens.
async function converse(ask) {
    const messages = [{ role: 'system', content: system }, { role: 'user', content: 'Tell me about the sea.' }];
    const turns = [await ask(messages)];
    for (const [i, question] of ['And the sky?', 'And rivers?'].entries()) {
        messages.push({ role: 'assistant', reasoning_content: `The user asks about topic ${i + 1}. Keep it short.`,
                        content: `Here is answer ${i + 1}.` },
                      { role: 'user', content: question });
        turns.push(await ask(messages));
    }
    return turns;
}

// 300 generated tokens per answer: the slot's KV runs more than two windows past the point where the next prompt
// parts from it, so the sliding-window layers must still hold what came before that point.
const answer = 300;

test('the next turn after an answer with reasoning reuses everything before it, and recomputes no more than ' +
     'llama-server', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer,
              'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');

    const ours = await converse(async (messages) => {
        const r = await openai.chat.completions.create({ model, messages, temperature: 0, max_tokens: answer,
                                                         ignore_eos: true });
        assert.equal(r.usage.completion_tokens, answer);
        return { prompt: r.usage.prompt_tokens, cached: r.usage.prompt_tokens_details.cached_tokens };
    });

    // llama-server's chat route answers 500 when the output is not harmony (random weights), so its turns go through
    // its own template route and /completion: the same rendering and the same token sequence reach its cache.
    const port = await freePort();
    const proc = spawn(llamaServer, ['-m', await testModel('tiny-gpt-oss'), '--port', String(port), '-t', '1',
                                     '-c', '8192', '-np', '1'], { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    let theirs;
    try {
        assert.ok(await waitFor(async () => (await curl(`${url}/health`).catch(() => ({}))).status === 200));
        theirs = await converse(async (messages) => {
            const { body: rendered } = await curl(`${url}/apply-template`, { method: 'POST', body: { messages } });
            const { status, body } = await curl(`${url}/completion`, { method: 'POST', body: {
                prompt: rendered.prompt, temperature: 0, n_predict: answer, ignore_eos: true, cache_prompt: true } });
            assert.equal(status, 200, JSON.stringify(body));
            return { prompt: body.timings.cache_n + body.timings.prompt_n, cached: body.timings.cache_n };
        });
    } finally {
        proc.kill('SIGTERM');
    }

    const report = (turns) => turns.map((t) => `${t.prompt - t.cached} of ${t.prompt}`).join(', ');
    console.log(`recomputed per turn: keepwarm ${report(ours)}; llama-server ${report(theirs)}`);
    for (let i = 1; i < ours.length; i++) {
        assert.equal(ours[i].prompt, theirs[i].prompt, `turn ${i + 1}: both render the same prompt`);
        // Everything before the previous answer, and its generation prompt `<|start|>assistant` too: the history
        // re-renders that answer as `<|channel|>final<|message|>...<|end|>`, without its analysis channel.
        assert.ok(ours[i].cached >= ours[i - 1].prompt,
                  `turn ${i + 1}: reused ${ours[i].cached}, the previous prompt was ${ours[i - 1].prompt}`);
        assert.ok(ours[i].prompt - ours[i].cached <= theirs[i].prompt - theirs[i].cached,
                  `turn ${i + 1}: keepwarm recomputed ${report([ours[i]])}, llama-server ${report([theirs[i]])}`);
    }
});

// Agents with tool rounds (`keepwarm bench gauntlet`, no cache killers): once a turn has its final answer, the
// template drops what came before each of that turn's tool calls (their analysis), so the next user turn parts from
// the cached prompt in the middle of the previous turn, where the first tool call began, not at its end. The
// sliding-window layers must still hold the window before that point. Computed / ideal: what keepwarm computed over
// what a cache holding every earlier prompt would have to.
async function gauntletRatio(parallel) {
    const dir = tempDir('harmony-gauntlet');
    const json = path.join(dir, 'report.json');
    const args = ['bench', 'gauntlet', '--system-tokens', '512', '--tools', '4', '--agents', '2', '--turns', '2',
                  '--tool-rounds', '1', '--answer-tokens', '8', '--tool-result-tokens', '100', '--killers', 'none',
                  '--api', 'openai', '--launch', '--servers', 'keepwarm', '-m', await testModel('tiny-gpt-oss'),
                  '-c', '8192', '--parallel', String(parallel), '-t', '1', '--work-dir', path.join(dir, 'work'),
                  '--json', json];
    const r = await new Promise((resolve) => execFile(binary, args, { timeout: 300_000, maxBuffer: 64 << 20 },
        (error, stdout, stderr) => resolve({ code: error ? error.code : 0, stderr })));
    assert.equal(r.code, 0, r.stderr);
    const [summary] = JSON.parse(readFileSync(json, 'utf8')).targets;
    assert.equal(summary.failures, 0);
    return summary.computed_over_ideal;
}

test('agents with tool rounds, one slot: the next user turn reuses the prompt up to its first tool call', async () => {
    const ratio = await gauntletRatio(1);
    assert.ok(ratio <= 1.2, `computed / ideal ${ratio}`);
});

// Two agents at once, each with three user turns and a tool round after each, through /apply-template and
// /completion on both servers (llama-server's chat route answers 500 on random output; the grammar keeps the random
// text ASCII, as its /completion fails on split UTF-8). Returns the prompt tokens each request computed.
async function concurrentAgents(url) {
    async function ask(messages) {
        const { body: rendered } = await curl(`${url}/apply-template`, { method: 'POST', body: { messages } });
        const { status, body } = await curl(`${url}/completion`, { method: 'POST', body: { prompt: rendered.prompt,
            temperature: 0, n_predict: 8, ignore_eos: true, cache_prompt: true, grammar: 'root ::= [a-z ]*' } });
        assert.equal(status, 200, JSON.stringify(body));
        return body.timings.prompt_n;
    }
    const output = filler.join(' ').repeat(6);  // about 100 tokens
    async function agent(k) {
        const task = Array.from({ length: 200 }, (_, i) => filler[(i * k + 1) % filler.length]).join(' ');
        const shared = system.split(' ').slice(0, 700).join(' ');
        const messages = [{ role: 'system', content: `${shared} Project ${k}. ${task}` }];
        const computed = [];
        for (let turn = 1; turn <= 3; turn++) {
            messages.push({ role: 'user', content: `Task ${turn} for agent ${k}.` });
            computed.push(await ask(messages));
            const id = `call_${k}_${turn}`;
            messages.push({ role: 'assistant', content: `Let me run step ${turn}.`, tool_calls: [{ id, type: 'function',
                            function: { name: 'shell', arguments: JSON.stringify({ cmd: `make step${turn}` }) } }] },
                          { role: 'tool', tool_call_id: id, content: `step ${turn} output: ${output}` });
            computed.push(await ask(messages));
            messages.push({ role: 'assistant', content: `Step ${turn} is done.` });
        }
        return computed;
    }
    return Promise.all([agent(1), agent(2)]);
}

// Two slots decoding together: llama.cpp would place one sequence's new tokens in cells that hold another sequence's
// positions outside that sequence's own window (llama_kv_cache::find_slot), which with a 128-token window is nearly
// all of a conversation; keepwarm then saw the window before the next turn's start gone and recomputed the whole
// prompt (3,362 tokens against llama-server's 3,144). The prompt cache's guard sequence now shares every cached cell,
// so none is taken. llama-server keeps each slot's KV apart (kv_unified false) and loses nothing here, though it
// cannot share the agents' common system prompt as keepwarm does.
test('two agents at once with tool rounds: keepwarm recomputes no more than llama-server', async () => {
    const llamaServer = findLlamaServer();
    assert.ok(llamaServer,
              'no llama-server: run bench/build-llama-server.sh (scripts/test.sh does) or set LLAMA_SERVER');
    const two = await startServer(['-c', '8192', '-np', '2'], { preset: 'tiny-gpt-oss' });
    let ours;
    try {
        ours = await concurrentAgents(two.url);
    } finally {
        await two.stop();
    }
    const port = await freePort();
    const proc = spawn(llamaServer, ['-m', await testModel('tiny-gpt-oss'), '--port', String(port), '-t', '1',
                                     '-c', '8192', '-np', '2'], { stdio: 'ignore' });
    const url = `http://127.0.0.1:${port}`;
    let theirs;
    try {
        assert.ok(await waitFor(async () => (await curl(`${url}/health`).catch(() => ({}))).status === 200));
        theirs = await concurrentAgents(url);
    } finally {
        proc.kill('SIGTERM');
    }
    const sum = (agents) => agents.flat().reduce((a, b) => a + b, 0);
    const report = `keepwarm ${JSON.stringify(ours)} = ${sum(ours)}, ` +
                   `llama-server ${JSON.stringify(theirs)} = ${sum(theirs)}`;
    console.log(`computed per request: ${report}`);
    assert.ok(sum(ours) <= sum(theirs), report);
});
