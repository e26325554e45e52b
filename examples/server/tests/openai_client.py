"""The real `openai` Python client against llada-server (started by tests/it/openai_client.rs):
completion, chat, streaming, the canvas stream, stop strings and errors.

Usage: python3 openai_client.py http://127.0.0.1:PORT/v1
"""

import sys
import traceback

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
MODEL = "tiny-llada"
TOM = "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?"
ANSWER = "23 + 5 = 28. Answer: 28"

CHECKS = []


def check(f):
    CHECKS.append(f)
    return f


@check
def completion():
    r = client.completions.create(model=MODEL, prompt=TOM)
    assert r.choices[0].text == ANSWER, r
    assert r.choices[0].finish_reason == "stop", r
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0, r.usage
    d = r.model_extra["diffusion"]
    # generate's defaults: the checkpoint's 24 positions, strategy mbsd.
    assert d["gen_length"] == 24 and d["strategy"] == "mbsd", d


@check
def completion_with_diffusion_fields():
    r = client.completions.create(
        model=MODEL, prompt=TOM, max_tokens=20, extra_body={"strategy": "prefix-cache", "block_length": 8}
    )
    d = r.model_extra["diffusion"]
    assert d["strategy"] == "prefix-cache" and d["gen_length"] == 24 and d["max_tokens_requested"] == 20, d
    assert r.choices[0].text == ANSWER, r


@check
def chat():
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": TOM}])
    m = r.choices[0].message
    assert m.role == "assistant" and m.content == ANSWER, r
    assert r.choices[0].finish_reason == "stop", r


@check
def streaming():
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=TOM, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ANSWER, text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"], finishes
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, chunks[-1]


@check
def chat_streaming():
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": TOM}], stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER, text
    assert chunks[-1].choices[0].finish_reason == "stop", chunks[-1]


@check
def canvas_stream_through_the_client():
    # The canvas rides on ordinary chunks, so the client still parses every one of them. Blocks
    # of 8 take a forward each (the default, one block, decides this answer in one forward).
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=TOM,
            stream=True,
            stream_options={"canvas": True},
            extra_body={"block_length": 8},
        )
    )
    canvases = [c.model_extra["canvas"] for c in chunks if c.model_extra.get("canvas")]
    assert len(canvases) >= 3, len(canvases)
    states = {s for cv in canvases for s in cv["states"]}
    assert {"masked", "stable"} <= states, states
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ANSWER


@check
def stop_strings():
    r = client.completions.create(model=MODEL, prompt=TOM, stop=[" Answer"])
    assert r.choices[0].text == "23 + 5 = 28.", r
    assert r.choices[0].finish_reason == "stop", r
    chunks = list(client.completions.create(model=MODEL, prompt=TOM, stop="= 28", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "23 + 5 ", chunks


def expect_error(cls, param, **kwargs):
    try:
        client.completions.create(model=kwargs.pop("model", MODEL), **kwargs)
    except cls as e:
        assert e.param == param, (e.param, e.body)
        assert e.status_code // 100 == 4, e.status_code
        assert param is None or param in e.message, e.message
        return
    raise AssertionError(f"no {cls.__name__} for {kwargs}")


@check
def errors_name_the_field():
    expect_error(openai.BadRequestError, "max_tokens", prompt=TOM, max_tokens=-5)
    expect_error(openai.BadRequestError, "max_tokens", prompt=TOM, max_tokens=10**9)
    expect_error(openai.BadRequestError, "max_tokens", prompt=TOM, extra_body={"max_tokens": "many"})
    expect_error(openai.BadRequestError, "strategy", prompt=TOM, extra_body={"strategy": "fastest"})
    expect_error(openai.BadRequestError, "steps", prompt=TOM, extra_body={"steps": 7})
    expect_error(openai.BadRequestError, "prompt", prompt="apples " * 300)
    expect_error(openai.BadRequestError, "n", prompt=TOM, n=2)
    expect_error(openai.NotFoundError, "model", prompt=TOM, model="gpt-4")
    # Errors of a streamed request come before the stream starts: the client raises them too.
    expect_error(openai.BadRequestError, "temperature", prompt=TOM, temperature=-1, stream=True)


def main():
    passed = failed = 0
    for f in CHECKS:
        try:
            f()
            passed += 1
            print(f"ok {f.__name__}")
        except Exception:
            failed += 1
            print(f"FAILED {f.__name__}")
            traceback.print_exc()
    print(f"openai {openai.__version__}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


main()
