"""Chat templates: SmolLM2's own against transformers, and the sandbox's HF-compatible globals."""

from __future__ import annotations

import pytest

from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.text.chat_template import ChatTemplate, apply_chat_template
from jacana_engine.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer) -> Tokenizer:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def hf(hf_smollm2_tokenizer):
    return hf_smollm2_tokenizer


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "How are you?\nTell me in two lines."},
    ],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "unicode: 你好 🎉 <b>tags</b> {{ not jinja }}"},
    ],
    [{"role": "user", "content": ""}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_matches_transformers(tok, hf, messages, add_generation_prompt):
    ours = apply_chat_template(tok, messages, add_generation_prompt=add_generation_prompt)
    reference = hf.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert ours == reference
    assert tok.encode(ours, add_special_tokens=False) == hf.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )


def test_smollm2_continue_final_message(tok, hf):
    messages = [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Autumn moonlight -"},
    ]
    ours = tok.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert ours == hf.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert ours.endswith("<|im_start|>assistant\nAutumn moonlight -")


def test_none_valued_keys_are_dropped(tok):
    with_none = [{"role": "user", "content": "x", "name": None}]
    assert tok.apply_chat_template(with_none) == tok.apply_chat_template(
        [{"role": "user", "content": "x"}]
    )


def test_hf_whitespace_and_globals():
    source = (
        "{% for m in messages %}\n"
        "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "{{ m.content | tojson }}|{{ bos_token }}|{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"
        "{% generation %}G{% endgeneration %}"
        "{{ strftime_now('%Y') | length }}"
        "{{ dict(a=1) | tojson }}"
    )
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    messages = [{"role": "system", "content": "skip"}, {"role": "user", "content": "<é>"}]
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before
    # one; tojson keeps non-ASCII and HTML characters as they are.
    assert template.render(messages) == '"<é>"|<s>|</s>\n1G4{"a": 1}'


def test_template_variables_and_tools():
    template = ChatTemplate(
        "{{ tools | length }}{{ enable_thinking }}{% if add_generation_prompt %}>{% endif %}"
    )
    text = template.render(
        [{"role": "user", "content": "x"}], tools=[{"type": "function"}], enable_thinking=False
    )
    assert text == "1False>"


def test_raise_exception_becomes_invalid_request():
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    )
    with pytest.raises(InvalidRequestError, match="first must be user") as info:
        template.render([{"role": "assistant", "content": "x"}])
    assert info.value.param == "messages"


def test_template_type_errors_become_invalid_request(tok):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template(parts)


@pytest.mark.parametrize(
    "messages",
    [[], "hello", [{"content": "no role"}], [{"role": "user", "content": object()}], ["x"]],
)
def test_malformed_messages(messages):
    with pytest.raises(InvalidRequestError):
        ChatTemplate("{{ messages }}").render(messages)


def test_sandbox_blocks_python_internals():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InvalidRequestError):
        ChatTemplate(escape).render([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidRequestError):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidRequestError):  # the immutable sandbox: no mutation of inputs
        ChatTemplate("{{ messages.append(1) }}").render([{"role": "user", "content": "x"}])


def test_no_template_is_a_clear_error(tok):
    from tokenizers import Tokenizer as Backend

    bare = Tokenizer(Backend.from_str(tok.backend.to_str()), special_tokens={})
    with pytest.raises(InvalidRequestError, match="no chat template"):
        apply_chat_template(bare, [{"role": "user", "content": "hi"}])


def test_syntax_error_fails_at_compile_time():
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_continue_final_message_conflicts():
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(InvalidRequestError, match="exclusive"):
        template.render(
            [{"role": "assistant", "content": "x"}],
            add_generation_prompt=True,
            continue_final_message=True,
        )
    dropping = ChatTemplate("nothing")
    with pytest.raises(InvalidRequestError, match="cannot be continued"):
        dropping.render(
            [{"role": "assistant", "content": "x"}],
            add_generation_prompt=False,
            continue_final_message=True,
        )
