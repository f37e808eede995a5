"""fsdp's chat templates against transformers' apply_chat_template, on each
supported family's real template (data/, scripts/fetch_data.sh): Qwen3's
(thinking blocks, tools), Llama 3's and Llama 3.2 Instruct's (the date, a
system message taken out, tools in the first user message) and Mistral
Nemo's (alternation checked by raise_exception, tools, tool-call ids).
For each conversation (one message; a system prompt; several turns; an
answer with reasoning; a tool call and its result) with and without
add_generation_prompt, with and without tools, and with
enable_thinking=False, `fsdp data encode --chat` gives
apply_chat_template(tokenize=True)'s ids, and refuses what it refuses
(every conversation of a family in one `--each-line` run).
Then bad data and templates outside the subset are refused by `fsdp data
prepare`, naming the line and the construct.
"""
import json
import os
import subprocess

import numpy as np
import transformers

import harness
import token_files

FAMILIES = ("qwen3", "llama3", "llama3_2", "mistral_nemo")

CONVERSATIONS = {
    "one message": [{"role": "user", "content": "hi"}],
    "system prompt": [{"role": "system", "content": "Be brief.  "}, {"role": "user", "content": " What is 2+2?\n"}],
    "multi-turn": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}, {"role": "assistant", "content": "d\n"}],
    "reasoning": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nans1"},
                  {"role": "user", "content": "q2 日本語 👋"},
                  {"role": "assistant", "content": "<think>\nr2\n</think>\n\nans2"}],
    "reasoning field": [{"role": "user", "content": "x"},
                        {"role": "assistant", "content": "y", "reasoning_content": "because"}],
    "tool call": [{"role": "user", "content": "weather?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "abcdefghi", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
                  {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"},
                  {"role": "assistant", "content": "It is sunny."}],
    "not alternating": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather \"now\"",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def ours(args, directory, records, generation_prompt):
    """fsdp's ids for each of RECORDS, in one `fsdp data encode --chat
    --each-line` (the tokenizer loads once): a list of ids, or ("refused",
    the message) for a record the template refuses."""
    command = [args.fsdp, "data", "encode", "--chat", "--each-line", "--tokenizer", directory]
    if generation_prompt:
        command.append("--add-generation-prompt")
    result = subprocess.run(command, input="".join(json.dumps(r) + "\n" for r in records), capture_output=True,
                            text=True)
    lines = result.stdout.split("\n")[:-1]  # one line each, ended by "\n" (a message may hold other line breaks)
    if len(lines) != len(records) or result.returncode != (1 if any(x.startswith("error: ") for x in lines) else 0):
        harness.fail(f"data encode --each-line: {len(lines)} lines for {len(records)} records, exit "
                     f"{result.returncode}: {result.stderr}")
    return [("refused", x[len("error: "):]) if x.startswith("error: ") else [int(i) for i in x.split(",") if i]
            for x in lines]


def theirs(tokenizer, messages, generation_prompt, tools, kwargs):
    try:
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                            tools=tools, **kwargs)
    except Exception as e:  # the template's raise_exception
        return "refused", str(e)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return list(ids), ""


def refused(args, work, name, lines, expected, directory):
    """`fsdp data prepare` of LINES exits 1 with every string of EXPECTED in its message."""
    data = os.path.join(work, name + ".jsonl")
    with open(data, "w") as f:
        f.write("\n".join(lines) + "\n")
    result = subprocess.run([args.fsdp, "data", "prepare", "--input", data, "--out-dir", os.path.join(work, name),
                             "--tokenizer", directory], capture_output=True, text=True)
    message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    if result.returncode != 1 or not all(e in message for e in expected):
        harness.fail(f"{name}: expected exit 1 naming {expected}, got {result.returncode}: {result.stderr}")
    print(f"{name}: refused: {message}")


def main():
    args = harness.parse_args(__doc__)
    work = harness.work_dir(args)
    data = os.path.join(harness.SOURCE_DIR, "data")
    missing = [f for f in FAMILIES if not os.path.isfile(os.path.join(data, f, "tokenizer_config.json"))]
    if missing:
        print(f"SKIP: data/{missing[0]} is missing (scripts/fetch_data.sh fetches it)")
        raise SystemExit(77)
    compared = 0
    for family in FAMILIES:
        directory = os.path.join(data, family)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        agreed = refusals = 0
        for generation_prompt in (False, True):
            cases, records = [], []
            for name, messages in CONVERSATIONS.items():
                for tools in (None, TOOLS):
                    for kwargs in ({}, {"enable_thinking": False}):
                        expected, why = theirs(tokenizer, messages, generation_prompt, tools, kwargs)
                        if tools:
                            # data encode --chat renders without tools: only prepare reads a record's.
                            continue
                        cases.append((f"{family}, {name}, add_generation_prompt={generation_prompt}, "
                                      f"{kwargs or 'no kwargs'}", expected, why))
                        records.append({"messages": messages, "chat_template_kwargs": kwargs})
            for (case, expected, why), got in zip(cases, ours(args, directory, records, generation_prompt)):
                message = got[1] if isinstance(got, tuple) else ""
                got = got[0] if isinstance(got, tuple) else got
                if got != expected:
                    harness.fail(f"{case}: fsdp {got} {message.strip()}\n  transformers {expected} {why}")
                if got == "refused":
                    # The template's own words reach the user.
                    if why.split(":")[-1].strip()[:40] not in message:
                        harness.fail(f"{case}: fsdp's refusal does not carry the template's message "
                                     f"'{why}': {message}")
                    refusals += 1
                agreed += 1
        compared += agreed
        print(f"{family}: {agreed} renderings equal apply_chat_template's ids ({refusals} refused by both)")

    # Tools reach the template through prepare's records: the examples'
    # tokens are apply_chat_template's with the same tools.
    for family in ("qwen3", "llama3_2", "mistral_nemo"):
        directory = os.path.join(data, family)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        records = [{"messages": CONVERSATIONS[n], "tools": TOOLS} for n in ("tool call", "multi-turn")]
        path = os.path.join(work, family + "-tools.jsonl")
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        out = os.path.join(work, family + "-tools")
        said = harness.run([args.fsdp, "data", "prepare", "--input", path, "--out-dir", out, "--tokenizer", directory,
                            "--val-fraction", "0"]).stdout
        if family == "mistral_nemo" and "1 assistant message is left out of the loss" not in said:
            harness.fail(f"mistral_nemo: the first answer of a multi-turn conversation with tools (the tools go "
                         f"before the last user message only) is not reported left out of the loss:\n{said}")
        tokens = token_files.read(os.path.join(out, "train.bin")).tolist()
        # The tool call's answer is trained whole: its opening special token
        # ([TOOL_CALLS] on Mistral), the call, and the end of the turn.
        mask = np.fromfile(os.path.join(out, "train.mask"), dtype=np.uint8, offset=1024)
        first = len(theirs(tokenizer, records[0]["messages"], False, TOOLS, {})[0])
        trained = [t for t, m in zip(tokens[:first], mask[:first]) if m & 1]
        text = tokenizer.decode(trained, skip_special_tokens=False)
        for part in ("get_weather", "It is sunny.", tokenizer.eos_token if family != "llama3_2" else "<|eot_id|>"):
            if part not in text:
                harness.fail(f"{family}: the trained tokens of a tool call's conversation lack {part!r}: {text!r}")
        print(f"{family}: the answers of a conversation with a tool call are trained: {text!r}")
        expected = []
        for r in records:
            expected += theirs(tokenizer, r["messages"], False, TOOLS, {})[0]
        harness.check(f"{family}: tokens of examples with tools unlike apply_chat_template's",
                      int(tokens != expected), 0)

    directory = os.path.join(data, "qwen3")
    refused(args, work, "unknown-role",
            ['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
             '{"messages": [{"role": "bot", "content": "a"}]}'],
            ["line 2", "'bot'", "system, user, assistant, tool"], directory)
    refused(args, work, "no-role", ['{"messages": [{"content": "a"}, {"role": "assistant", "content": "b"}]}'],
            ["line 1", "message 1", "\"role\""], directory)
    refused(args, work, "deep-record",
            ['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "tools": ' +
             "[" * 100000 + "]" * 100000 + "}"], ["line 1", "deeper than 64"], directory)
    refused(args, work, "no-answer", ['{"messages": [{"role": "user", "content": "a"}]}'],
            ["line 1", "no assistant message"], directory)
    # What apply_chat_template refuses is refused here too: tools that are
    # not a list, and chat_template_kwargs setting what the record gives.
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    for bad_tools in ("notalist", {"name": "f"}):
        try:
            transformers.AutoTokenizer.from_pretrained(directory).apply_chat_template(record["messages"],
                                                                                        tools=bad_tools)
            harness.fail(f"transformers renders tools={bad_tools!r}: the premise is gone")
        except Exception:  # noqa: BLE001 - refused, as expected
            pass
        refused(args, work, "tools-" + type(bad_tools).__name__, [json.dumps(dict(record, tools=bad_tools))],
                ["line 1", "\"tools\" is a", "expected a list of tool definitions"], directory)
    try:
        transformers.AutoTokenizer.from_pretrained(directory).apply_chat_template(record["messages"], messages=[])
        harness.fail("transformers takes messages twice: the premise is gone")
    except Exception:  # noqa: BLE001 - refused (a TypeError: messages given twice)
        pass
    refused(args, work, "kwargs-messages", [json.dumps(dict(record, chat_template_kwargs={"messages": []}))],
            ["line 1", "chat_template_kwargs sets \"messages\""], directory)
    refused(args, work, "mixed-kinds",
            ['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}',
             '{"text": "plain"}'], ["line 2", "one kind"], directory)
    for name, construct, template in (
            ("macro", "the statement 'macro'", "{% macro greet(x) %}{{ x }}{% endmacro %}{{ greet(messages) }}"),
            ("filter", "the filter 'wordcount'", "{{ messages[0].content | wordcount }}"),
            ("unclosed", "'if' is never closed", "{% for m in messages %}{{ m.content }}{% endfor %}{% if x %}")):
        custom = os.path.join(work, "template-" + name)
        os.makedirs(custom, exist_ok=True)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(directory, file)) as src, open(os.path.join(custom, file), "w") as dst:
                dst.write(src.read())
        with open(os.path.join(custom, "chat_template.jinja"), "w") as f:
            f.write(template)
        refused(args, work, "template-" + name,
                ['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'],
                ["chat template", "line 1", construct], custom)
    # Answers cut away by --seq-len train nothing: a run in which no example
    # keeps a trained token is refused before anything is written (it
    # reported a loss of 0 and exported the model unchanged); one in which
    # some examples keep none says how many.
    cut = os.path.join(work, "cut")
    with open(cut + ".jsonl", "w") as f:
        for prompt in ("Hi", "Tell me, in all the detail you have, " * 30):
            f.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": "Yes, gladly."}]}) + "\n")
    harness.run([args.fsdp, "data", "prepare", "--input", cut + ".jsonl", "--out-dir", cut, "--tokenizer", directory,
                 "--val-fraction", "0"])

    def train_cut(seq_len):
        out = os.path.join(work, f"cut-run-{seq_len}")
        result = subprocess.run([args.fsdp, "train", "--model", "qwen3-tiny", "--vocab-size", "151936", "--data",
                                 os.path.join(cut, "train.bin"), "--seq-len", str(seq_len), "--batch-size", "1",
                                 "--steps", "1", "--out-dir", out], capture_output=True, text=True)
        return result, out

    result, out = train_cut(4)
    if result.returncode != 1 or "no example keeps a trained token" not in result.stderr or os.path.exists(out):
        harness.fail(f"--seq-len 4 cuts every answer and was not refused: {result.returncode} {result.stderr[-600:]}")
    print("every answer cut: refused: " + result.stderr.strip().splitlines()[-1][:200])
    result, out = train_cut(48)
    if result.returncode != 0 or "1 of 2 chat examples" not in result.stdout + result.stderr:
        harness.fail(f"--seq-len 48 cuts one answer and did not say so: {result.returncode} {result.stderr[-600:]}")
    print(f"{compared} renderings compared")


if __name__ == "__main__":
    main()
