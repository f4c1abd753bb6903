"""Writes tests/fixtures/jinja/cases.json: chat templates and Jinja constructs rendered by jinja2
exactly as transformers' apply_chat_template renders them, for tests/unit/test_jinja.c.

The environment is transformers' own (transformers.utils.chat_template_utils
._compile_jinja_template: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, loopcontrols]), a json.dumps `tojson`, raise_exception,
strftime_now, dict, namespace) when transformers is installed; otherwise a copy of it built
here (make_env, as tests/ref/test_chat_ref.py does, plus the {% generation %} tracker).
strftime_now formats a fixed time (NOW, or a case's "now") so that the C engine, given the same
unix time, must print the same date. As in transformers, `tools` and `documents` are always
passed (None when absent).

Each case: {"name", "template" | "template_file" (under tests/fixtures/jinja/templates), "vars",
"now"?, and "expect" (the text) with "gen" ([[byte offset, byte length], ...] of the
{% generation %} blocks) or "error" (jinja2's message) with "error_kind": "raise"
(raise_exception: the C message must contain "template error: " + this text), "syntax" (the
template does not parse) or "other" (any other runtime error)}.

Run from the repository root: python3 tests/ref/make_jinja_cases.py
"""
import copy
import datetime
import json
import math
import os
import sys
from contextlib import contextmanager

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures", "jinja")
TPL_DIR = os.path.join(FIX, "templates")
NOW = 1721952000  # 26 Jul 2024 00:00:00 UTC, ft_jinja_opts.now's default


def fixed_strftime(now):
    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(fmt)
    return strftime_now


# ---- the environment -------------------------------------------------------------------------

def make_env():
    """A copy of transformers' _cached_compile_jinja_template environment."""

    class AssistantTracker(Extension):
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._rendered_blocks = None
            self._generation_indices = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [],
                                          body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller):
            rv = caller()
            if self.is_active():
                start_index = len("".join(self._rendered_blocks))
                end_index = start_index + len(rv)
                self._generation_indices.append((start_index, end_index))
            return rv

        def is_active(self):
            return self._rendered_blocks is not None or self._generation_indices is not None

        @contextmanager
        def activate_tracker(self, rendered_blocks, generation_indices):
            try:
                self._rendered_blocks = rendered_blocks
                self._generation_indices = generation_indices
                yield
            finally:
                self._rendered_blocks = None
                self._generation_indices = None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = fixed_strftime(NOW)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


try:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    def compile_template(src):
        return _compile_jinja_template(src)
    ENGINE = "transformers"
except Exception:  # noqa: BLE001 - any import failure: use the copy
    _ENV = make_env()

    def compile_template(src):
        return _ENV.from_string(src)
    ENGINE = "copy of transformers' environment"


def render(src, vars_, now):
    """(text, gen byte spans) or raises jinja2's exception."""
    tpl = compile_template(src)
    blocks, gen = [], []
    kw = dict(vars_)
    kw["strftime_now"] = fixed_strftime(now)   # shadows the global (real time) by name
    with tpl.environment.activate_tracker(blocks, gen):
        for b in tpl.generate(**kw):
            blocks.append(b)
    text = "".join(blocks)
    spans = [[len(text[:a].encode()), len(text[a:b].encode())] for a, b in gen]
    return text, spans


def check_json_safe(x, where):
    """cJSON keeps no int/float distinction: integral floats would read back as ints."""
    if isinstance(x, float):
        assert not (math.isfinite(x) and x == int(x)), f"{where}: integral float {x!r}"
    elif isinstance(x, int) and not isinstance(x, bool):
        assert abs(x) < 9.2e18 and float(x) == x, f"{where}: int {x} not exact as a double"
    elif isinstance(x, dict):
        for k, v in x.items():
            check_json_safe(v, where)
    elif isinstance(x, list):
        for v in x:
            check_json_safe(v, where)


def make_case(name, vars_, template=None, template_file=None, now=NOW):
    check_json_safe(vars_, name)
    src = template if template is not None else open(os.path.join(TPL_DIR, template_file),
                                                     encoding="utf-8", newline="").read()
    case = {"name": name}
    if template is not None:
        case["template"] = template
    else:
        case["template_file"] = template_file
    case["vars"] = vars_
    if now != NOW:
        case["now"] = now
    try:
        compile_template(src)
    except Exception as e:  # noqa: BLE001 - TemplateSyntaxError, or Python's SyntaxError
        case["error"] = getattr(e, "message", None) or str(e)
        case["error_kind"] = "syntax"
        return case
    try:
        text, spans = render(src, copy.deepcopy(vars_), now)
        case["expect"] = text
        if spans:
            case["gen"] = spans
    except jinja2.exceptions.TemplateError as e:
        kind = "other"
        if type(e) is jinja2.exceptions.TemplateError:
            kind = "raise"
        case["error"] = str(e)
        case["error_kind"] = kind
    except Exception as e:  # noqa: BLE001 - Python errors inside the template (TypeError, ...)
        case["error"] = f"{type(e).__name__}: {e}"
        case["error_kind"] = "other"
    return case


# ---- conversations for the real templates ----------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "threshold": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}]

U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions and write code."}
U2 = {"role": "user", "content": "Write a haiku about the sea."}
A2 = {"role": "assistant", "content": "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."}
SYS = {"role": "system", "content": "You are a concise assistant."}

CONVERSATIONS = {
    "basic": ([U1, A1, U2, A2], {}),
    "system": ([SYS, U1, A1, U2], {}),
    "single": ([U1], {}),
    "unicode": ([{"role": "user", "content": "  Grüße! 你好 — «quotes» 'single' \"double\"\t\n"},
                 {"role": "assistant", "content": "\n\nTabulatoren — Größe ß. 🙂 \\n literal  "}], {}),
    "think": ([U1, {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"},
               U2, {"role": "assistant", "content": "<think>short</think>Sea haiku."}], {}),
    "tools": ([{"role": "user", "content": "What's the weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "abcDEF123", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
               {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather",
                "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
               {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."}],
              {"tools": TOOLS}),
    "tools_str_args": ([{"role": "user", "content": "Weather in Oslo?"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "xyzXYZ789", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                        {"role": "tool", "tool_call_id": "xyzXYZ789", "content": "cold"}],
                       {"tools": TOOLS}),
    "bad_order": ([A1, U1], {}),
    "two_users": ([U1, U2], {}),
}
GEN_PROMPT = {"single", "system", "tools", "two_users", "think"}   # also rendered with True

BOS_EOS = {
    "chatref-llama3-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "chatref-llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.3-70b-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma-2-2b-it": ("<bos>", "<eos>"),
    "phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "deepseek-r1-distill-qwen-32b": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "qwq-32b": ("", "<|im_end|>"),
    "chatref-qwen3": ("", "<|im_end|>"),
    "chatref-chatml": ("", "<|im_end|>"),
    "granite-3.3-2b-instruct": ("", "<|end_of_text|>"),
}


def real_template_cases():
    cases = []
    for fn in sorted(os.listdir(TPL_DIR)):
        if not fn.endswith(".jinja"):
            continue
        stem = fn[:-len(".jinja")]
        bos, eos = BOS_EOS.get(stem, ("<s>", "</s>"))
        for conv, (msgs, extra) in CONVERSATIONS.items():
            for agp in ([False, True] if conv in GEN_PROMPT else [False]):
                v = {"messages": msgs, "tools": None, "documents": None, "bos_token": bos,
                     "eos_token": eos, "add_generation_prompt": agp}
                v.update(extra)
                cases.append(make_case(f"tpl:{stem}:{conv}:{'gp' if agp else 'nogp'}", v,
                                       template_file=fn))
        if stem == "chatref-qwen3":   # enable_thinking False / reasoning_content
            v = {"messages": [U1, {"role": "assistant", "content": "Hi!", "reasoning_content": "greet"}, U2],
                 "tools": None, "documents": None, "bos_token": bos, "eos_token": eos,
                 "add_generation_prompt": True, "enable_thinking": False}
            cases.append(make_case(f"tpl:{stem}:reasoning:nothink", v, template_file=fn))
        if stem == "llama-3.3-70b-instruct":   # tools in the system message, builtin tools
            v = {"messages": [SYS, U1], "tools": TOOLS, "documents": None, "bos_token": bos,
                 "eos_token": eos, "add_generation_prompt": True, "tools_in_user_message": False,
                 "builtin_tools": ["brave_search", "code_interpreter"], "date_string": "01 Jan 2025"}
            cases.append(make_case(f"tpl:{stem}:system_tools:gp", v, template_file=fn))
        if stem == "gemma-3-it":   # multimodal-style content lists
            v = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                              {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
                              {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}],
                 "tools": None, "documents": None, "bos_token": bos, "eos_token": eos,
                 "add_generation_prompt": False}
            cases.append(make_case(f"tpl:{stem}:content_parts:nogp", v, template_file=fn))
        if stem == "levanter-alt-generation":   # enable_thinking values, tools, instructions
            for i, extra in enumerate([{"enable_thinking": False}, {"enable_thinking": "experimental"},
                                       {"enable_thinking": True, "custom_instructions": "Follow best practices.",
                                        "xml_tools": ["{\"name\": \"final_answer\"}", "{\"name\": \"web_search\"}"]}]):
                v = {"messages": [U1, A1], "tools": None, "documents": None, "bos_token": bos,
                     "eos_token": eos, "add_generation_prompt": i == 2}
                v.update(extra)
                cases.append(make_case(f"tpl:{stem}:kwargs{i}", v, template_file=fn))
        if stem == "granite-3.3-2b-instruct":
            v = {"messages": [U1], "tools": None, "bos_token": bos, "eos_token": eos,
                 "add_generation_prompt": True, "controls": {"citations": True, "length": "short"},
                 "documents": [{"doc_id": 7, "text": "The sea is salty."}]}
            cases.append(make_case(f"tpl:{stem}:documents:gp", v, template_file=fn, now=1735689600))
    return cases


# ---- hand-written constructs -------------------------------------------------------------------

MSGS = [{"role": "system", "content": " sys "}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
D = {"b": 2, "a": 1, "C": 3}
PEOPLE = [{"name": "Bob", "age": 31, "tags": ["x"]}, {"name": "alice", "age": 25},
          {"name": "Carol", "age": 31, "nick": None}]

CONSTRUCTS = [
    # text, comments, whitespace control, trim_blocks, lstrip_blocks
    ("ws:plain", "Hello {{ name }}!\n", {"name": "W"}),
    ("ws:trailing_newline_dropped_once", "a\n\n", {}),
    ("ws:crlf_normalised", "a\r\nb\rc{% if true %}\r\nX{% endif %}", {}),
    ("ws:trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("ws:lstrip_blocks", "x\n    {% if true %}\n    in\n    {% endif %}\ny", {}),
    ("ws:lstrip_not_var", "a\n    {{ 1 }}\n", {}),
    ("ws:lstrip_tag_after_text", "a  {% if true %}b{% endif %}", {}),
    ("ws:minus_both", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c", {}),
    ("ws:minus_var", "a \n {{- 'x' -}} \n b", {}),
    ("ws:plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}", {}),
    ("ws:plus_disables_trim", "{% if true +%}\nb{% endif %}", {}),
    ("ws:comment", "a {# note\n multi #} b\n  {# x #}\nc {#- y -#}  d", {}),
    ("ws:comment_trim", "{# c #}\nafter", {}),
    ("ws:raw", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|", {}),
    ("ws:raw_strip", "a  {%- raw -%}  x  {%- endraw -%}  b", {}),
    ("ws:first_line_lstrip", "   {% if true %}X{% endif %}", {}),
    ("ws:unicode_text", "é{{ s }}✓\n", {"s": "漢字"}),
    ("ws:braces_in_string", "{{ '}}' ~ \"%}\" ~ '{{' }}", {}),
    ("ws:dict_in_var", "{{ {'a': {'b': 1}} }}", {}),
    # literals and printing
    ("print:none_bool", "{{ none }} {{ None }} {{ true }} {{ False }} {{ x }}|", {}),
    ("print:numbers", "{{ 1 }} {{ -3 }} {{ 1.5 }} {{ 2.0 }} {{ 1e3 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 0.25 }} {{ 1.5e-3 }}", {}),
    ("print:float_repr", "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.123 }} {{ 2.5e-7 }} {{ 10/4 }} {{ 1e22 }} {{ -0.0 }}", {}),
    ("print:list_repr", "{{ [1, 'a', none, true, 2.5, ['n'], {'k': 'v'}] }}", {}),
    ("print:str_repr_quotes", "{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'tab\\tnl\\n', 'back\\\\slash'] }}", {}),
    ("print:tuple_repr", "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ ('a', ('b', 3)) }}", {}),
    ("print:dict_repr", "{{ d }} {{ {} }} {{ {1: 'one', true: 'yes'} }}", {"d": D}),
    ("print:vars_types", "{{ i }} {{ f }} {{ s }} {{ l }} {{ o }} {{ n }} {{ b }}", {"i": 7, "f": 0.75, "s": "str", "l": [1, "x"], "o": {"k": [None]}, "n": None, "b": False}),
    ("print:string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\x41\\u00e9\\U0001F600\\101' }}", {}),
    ("print:adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("print:unicode_repr", "{{ ['é', '\\x85', 'ü\\u2028'] }}", {}),
    # operators
    ("op:arith", "{{ 7 + 2 }} {{ 7 - 9 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("op:precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1 ~ 2 * 3 }} {{ 'a' ~ (1 + 2) }} {{ not 1 == 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
    ("op:concat", "{{ 'a' ~ 1 ~ none ~ true ~ x ~ [1] }}", {}),
    ("op:str_list_mul_add", "{{ 'ab' * 3 }} {{ 2 * 'x' }} {{ [1] * 2 }} {{ [1] + [2, 3] }} {{ 'a' + 'b' }} {{ true + 1 }}", {}),
    ("op:compare", "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ none == none }} {{ 'a' == 'a' }} {{ (1, 2) == [1, 2] }} {{ x == y }} {{ x == none }}", {}),
    ("op:in", "{{ 'b' in 'abc' }} {{ 'z' not in 'abc' }} {{ 2 in [1, 2] }} {{ 'a' in {'a': 1} }} {{ 'x' in missing }} {{ '' in 'abc' }}", {}),
    ("op:and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or [] }} {{ not '' }} {{ x or 'dflt' }}", {}),
    ("op:condexpr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}", {}),
    ("op:unary", "{{ -x }} {{ +x }} {{ -(-3) }} {{ - 1.5 }} {{ -x|abs }}", {"x": 4}),
    # subscripts, attributes, slices
    ("print:large_numbers", "{{ 9007199254740993 }} {{ i }} {{ -i }} {{ 2 ** 62 }} {{ f }} {{ 1e300 * 10 }}", {"i": 4611686018427387904, "f": 1.25e-300}),
    ("sub:attr_item", "{{ m.role }} {{ m['content'] }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ m.missing }}|{{ m['nope'] }}|{{ l[9] }}|", {"m": MSGS[1], "l": [10, 20, 30]}),
    ("sub:slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[::2] }} {{ l[5:] }} {{ l[1:-1] }} {{ l[-100:100] }} {{ l[3:1:-1] }}", {"l": [0, 1, 2, 3, 4]}),
    ("sub:str_slices", "{{ s[0] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[::2] }} {{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }}", {"s": "abcdef"}),
    ("sub:messages_slice", "{% for m in messages[1:] %}{{ m.role }},{% endfor %}{{ messages[0]['content'] | trim }}", {"messages": MSGS}),
    ("sub:nested", "{{ d['a']['b'][1] }} {{ d.a.b.0 }}", {"d": {"a": {"b": [5, 6]}}}),
    ("sub:dict_method_shadows_key", "{{ d.items() | list }} {{ d['items'] }} {{ d.get('items') }}", {"d": {"items": "key!", "x": 1}}),
    # if / for / loop
    ("for:loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {"l": ["a", "b", "c"]}),
    ("for:prev_next", "{% for x in l %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}", {"l": [1, 2, 3]}),
    ("for:cycle_depth", "{% for x in l %}{{ loop.cycle('odd', 'even') }}{{ loop.depth }}{% for y in l %}{{ loop.depth }}{% endfor %};{% endfor %}", {"l": [1, 2]}),
    ("for:else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}x{% else %}no{% endfor %}", {}),
    ("for:dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": D}),
    ("for:items_filter", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", {"d": D}),
    ("for:inline_if", "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }}/{{ loop.length }} {% endfor %}", {"messages": MSGS}),
    ("for:filter_in_iter", "{% for x in l | sort | reverse %}{{ x }}{% endfor %}", {"l": [3, 1, 2]}),
    ("for:string_iter", "{% for ch in 'héy' %}[{{ ch }}]{% endfor %}", {}),
    ("for:break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("for:scope", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }},{% endfor %}{{ x }}", {}),
    ("for:scope_if_in_loop", "{% for i in range(3) %}{% if i == 1 %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}", {}),
    ("for:namespace", "{% set ns = namespace(n=0, last=none) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }} {{ ns.missing }}|", {"messages": MSGS}),
    ("for:tuple_unpack", "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("for:nested_loop_var", "{% for x in [1, 2] %}{% for y in [3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    ("if:elif_else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("if:truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}{{ 'T' if u else 'F' }}", {}),
    # set
    ("set:basic", "{% set a = 1 %}{% set b, c = 2, 3 %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }}", {}),
    ("set:block", "{% set x %}in {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper | trim %} hey {% endset %}[{{ y }}]", {}),
    ("set:overrides_var", "{{ messages | length }}{% set messages = messages[1:] %}{{ messages | length }}", {"messages": MSGS}),
    ("set:ns_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("set:ns_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
    # macros and call
    ("macro:defaults_kwargs", "{% macro m(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(1, c=3) }} {{ m(a='x', b='y') }}", {}),
    ("macro:missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro:sees_globals_at_call", "{% macro m() %}{{ g }}/{{ v }}{% endmacro %}{% set g = 3 %}{{ m() }}", {"v": "var"}),
    ("macro:recursion", "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", {}),
    ("macro:returns_string", "{% macro m(x) %} {{ x }} {% endmacro %}[{{ m('a') | trim }}]{{ m('b') | length }}", {}),
    ("macro:caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", {}),
    ("macro:caller_args", "{% macro each(l) %}{% for x in l %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}", {}),
    ("macro:too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("macro:filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
    ("with:block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}|", {}),
    # generation
    ("gen:spans", "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}", {"messages": MSGS}),
    ("gen:unicode_offsets", "é{% generation %}ü{{ x }}{% endgeneration %}✓{% generation %}{% endgeneration %}", {"x": "漢"}),
    ("gen:in_macro", "{% macro a(x) %}{% generation %}[{{ x }}]{% endgeneration %}{% endmacro %}ab{{ a(1) }}cd", {}),
    ("gen:macro_after_output", "{% macro a(x) %}{% generation %}[{{ x }}]{% endgeneration %}{% endmacro %}x{{ 'y' }}{{ a(1) }}z{{ a(2) }}", {}),
    ("gen:in_set_block", "{% set s %}pre{% generation %}IN{% endgeneration %}{% endset %}ab{{ s }}{% generation %}G{% endgeneration %}", {}),
    ("gen:in_loop_and_filter_block", "{% for i in range(2) %}{% generation %}{{ i }}{% endgeneration %}-{% endfor %}{% filter upper %}q{% generation %}w{% endgeneration %}{% endfilter %}", {}),
    # tests
    ("test:defined_none", "{{ x is defined }} {{ x is undefined }} {{ n is none }} {{ n is not none }} {{ n is defined }} {{ m.role is defined }} {{ m.nope is defined }}", {"n": None, "m": MSGS[0]}),
    ("test:types", "{% for v in [1, 1.5, 'a', true, none, [1], {'a': 1}, (1,)] %}{{ v is string }}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is boolean }}{{ v is mapping }}{{ v is sequence }}{{ v is iterable }}{{ v is none }};{% endfor %}{{ u is sequence }}{{ u is iterable }}", {}),
    ("test:true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}", {}),
    ("test:numbers", "{{ 3 is odd }} {{ 3 is even }} {{ -3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}", {}),
    ("test:compare", "{{ 'a' is equalto 'a' }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 2 is gt 1 }} {{ 2 is ge 2 }} {{ 1 is lt 2 }} {{ 1 is le 0 }} {{ 2 is in [1, 2] }} {{ 'b' is in 'abc' }}", {}),
    ("test:case", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '12' is upper }}", {}),
    ("test:callable_sameas", "{% macro m() %}{% endmacro %}{{ m is callable }} {{ 'x' is callable }} {{ none is sameas none }} {{ true is sameas true }} {{ range is callable }}", {}),
    ("test:select_with_tests", "{{ l | select('odd') | list }} {{ l | reject('odd') | list }} {{ l | select('greaterthan', 2) | list }} {{ [0, 1, '', 'a'] | select | list }}", {"l": [1, 2, 3, 4]}),
    ("test:unknown", "{{ 1 is frobnicated }}", {}),
    # filters
    ("filter:trim_length", "[{{ '  a b  ' | trim }}] [{{ 'xxaxx' | trim('x') }}] {{ 'héllo' | length }} {{ [1, 2] | count }} {{ d | length }} {{ u | length }}", {"d": D}),
    ("filter:tojson_default", "{{ v | tojson }}", {"v": {"s": "é\"\\\n\t\u0001<>&'", "l": [1, 2.5, True, None, []], "e": {}, "n": -3}}),
    ("filter:tojson_options", "{{ v | tojson(indent=2) }}|{{ v | tojson(indent=0) }}|{{ v | tojson(separators=(',', ':')) }}|{{ v | tojson(sort_keys=true) }}|{{ v | tojson(ensure_ascii=true) }}|{{ v | tojson(indent='\\t', sort_keys=true) }}", {"v": {"b": ["é", {"z": 1, "y": []}], "a": "🙂"}}),
    ("filter:tojson_positional_ensure_ascii", "{{ 'é' | tojson(4) }}", {}),
    ("filter:tojson_scalars", "{{ none | tojson }} {{ true | tojson }} {{ 1.5 | tojson }} {{ 'x' | tojson }} {{ (1, 'a') | tojson }} {{ 1e16 | tojson }} {{ {1: 2, none: 3, true: 4} | tojson }}", {}),
    ("filter:tojson_undefined", "{{ u | tojson }}", {}),
    ("filter:items_dictsort", "{{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(true) }} {{ d | dictsort(by='value', reverse=true) }}", {"d": D}),
    ("filter:join", "{{ ['a', 1, none] | join }} {{ ['a', 'b'] | join(', ') }} {{ people | join('/', attribute='name') }}", {"people": PEOPLE}),
    ("filter:case", "{{ 'hello WORLD' | upper }} {{ 'Hello' | lower }} {{ 'hello wORLD-x y(z' | title }} {{ 'hELLO world' | capitalize }} {{ 'éa' | upper }}", {}),
    ("filter:replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }} {{ 1234 | replace(2, 9) }}", {}),
    ("filter:first_last_list", "{{ l | first }} {{ l | last }} {{ 'abc' | first }} {{ 'abc' | last }} {{ 'ab' | list }} {{ d | list }} [{{ [] | first }}]", {"l": [1, 2, 3], "d": D}),
    ("filter:default", "{{ u | default('d') }} {{ u | d('d2') }} {{ '' | default('e') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ 0 | d(5, boolean=true) }} [{{ u | default }}]", {}),
    ("filter:string_int_float", "{{ 5 | string }} {{ [1] | string }} {{ '42' | int }} {{ ' 7 ' | int }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(9) }} {{ 3.9 | int }} {{ true | int }} {{ '0x1A' | int(0, 16) }} {{ '2.5' | float }} {{ 'x' | float }} {{ 3 | float }} {{ '1e3' | float }}", {}),
    ("filter:abs_round", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 7 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(0, 'floor') }} {{ 1234.5 | round(-2) }}", {}),
    ("filter:select_reject_attr", "{{ people | selectattr('age', 'equalto', 31) | map(attribute='name') | list }} {{ people | rejectattr('age', 'gt', 30) | map(attribute='name') | join }} {{ people | selectattr('nick') | list | length }} {{ people | selectattr('nick', 'defined') | map(attribute='name') | list }} {{ people | selectattr('nick', 'none') | map(attribute='name') | first }}", {"people": PEOPLE}),
    ("filter:map", "{{ people | map(attribute='name') | map('upper') | list }} {{ people | map(attribute='nick', default='-') | list }} {{ ['1', '2'] | map('int') | sum }} {{ people | map(attribute='age') | list }} {{ [people[0]] | map(attribute='tags.0') | list }}", {"people": PEOPLE}),
    ("filter:unique_reverse_sort", "{{ ['a', 'B', 'b', 'A', 'c'] | unique | list }} {{ ['a', 'B', 'b'] | unique(true) | list }} {{ 'abc' | reverse }} {{ [1, 2, 3] | reverse | list }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ people | sort(attribute='age') | map(attribute='name') | list }} {{ people | sort(attribute='name') | map(attribute='name') | join(',') }}", {"people": PEOPLE}),
    ("filter:min_max_sum", "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | min }} {{ people | max(attribute='age') }} {{ [1, 2.5] | sum }} {{ people | sum(attribute='age') }}", {"people": PEOPLE}),
    ("filter:safe_escape", "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}", {}),
    ("filter:indent", "[{{ 'a\\nb\\n\\nc' | indent }}] [{{ 'a\\nb' | indent(2, true) }}] [{{ 'a\\n\\nb' | indent(2, blank=true) }}] [{{ 'x\\ny' | indent('> ') }}] [{{ 'x\\r\\ny\\n' | indent(1) }}]", {}),
    ("filter:wordcount_center", "{{ 'Hello, world! x_y 42' | wordcount }} [{{ 'ab' | center(7) }}] [{{ 'abc' | center(6) }}]", {}),
    ("filter:attr", "{% set ns = namespace(v=3) %}{{ m | attr('role') }} {{ ns | attr('v') }}", {"m": MSGS[0]}),
    ("op:concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 3 }}", {}),
    ("filter:unknown", "{{ 'x' | frobnicate }}", {}),
    ("filter:in_unused_branch", "{% if false %}{{ x | frobnicate }}{% endif %}ok", {}),
    # string methods
    ("method:strip", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ 'abcba'.lstrip('ab') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}]", {"s": " \t a b \n "}),
    ("method:starts_ends", "{{ s.startswith('ab') }} {{ s.startswith(('x', 'a')) }} {{ s.endswith('ef') }} {{ s.endswith('e') }} {{ s.endswith(('f',)) }}", {"s": "abcdef"}),
    ("method:split", "{{ 'a,b,,c'.split(',') }} {{ ' a  b c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b c'.split(none, 1) }} {{ ' a  b c '.split(none, 1) }} {{ ' a  b c '.rsplit(none, 1) }} {{ '  '.split() }} {{ ''.split(',') }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a b c '.rsplit(none, 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}),
    ("method:case", "{{ 'hello world-x'.title() }} {{ 'hELLO'.capitalize() }} {{ 'aB'.upper() }} {{ 'aB'.lower() }} {{ 'aB'.swapcase() }} {{ \"they're bill's\".title() }}", {}),
    ("method:replace_find_count", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.find('z') }} {{ 'héllo'.find('l') }} {{ 'aaaa'.count('aa') }} {{ 'abc'.index('b') }}", {}),
    ("method:format_join", "{{ '{} + {} = {}'.format(1, 2, 3) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='x') }} {{ '{{}}'.format() }} {{ ', '.join(['a', 'b']) }}", {}),
    ("method:predicates", "{{ '123'.isdigit() }} {{ 'a1'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' \\n'.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'Ab Cd'.istitle() }}", {}),
    ("method:pad", "[{{ 'ab'.center(6, '*') }}][{{ 'ab'.ljust(4) }}][{{ 'ab'.rjust(4, '0') }}][{{ '-5'.zfill(4) }}] {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'prefix_x'.removeprefix('prefix_') }}", {}),
    ("method:dict", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.copy() }}", {"d": D}),
    ("method:list", "{{ l.index(2) }} {{ l.count(1) }} {{ l.copy() }}", {"l": [1, 2, 1]}),
    ("method:list_append_unsafe", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("method:dict_update_unsafe", "{% set d = {} %}{% set _ = d.update({'a': 1}) %}{{ d }}", {}),
    ("method:unknown_str", "{{ 'x'.frob() }}", {}),
    ("op:percent_format", "{{ '%s-%d-%05.2f|%-4s|%r|%x|%%' % ('a', 7.9, 3.14159, 'b', 'q', 255) }} {{ '%(n)s=%(v)i' % {'n': 'k', 'v': 2} }} {{ '%s' % none }} {{ '%s' % [1, 'a'] }} {{ '%5s|%.2s' % ('ab', 'xyz') }} {{ '%+d %e %g %c' % (5, 12345.678, 0.0001, 65) }}", {}),
    ("op:percent_errors", "{{ '%s %s' % ('a',) }}", {}),
    ("op:percent_extra", "{{ '%s' % ('a', 'b') }}", {}),
    ("filter:format", "{{ '%s, %s!' | format('Hello', 'World') }} {{ '%(a)s' | format(a=1) }} {{ '%d items' | format(3) }}", {}),
    # globals
    ("global:range", "{{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {{ range(0) | list }}", {}),
    ("global:namespace_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }} {{ dict(x=1, y='z') }} {{ dict([('k', 'v')]) }} {{ dict({'a': 1}, b=2) }}", {}),
    ("global:strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }} {{ strftime_now('%B %d, %Y %A %j') }}", {}),
    ("global:raise", "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported: ' ~ messages[0].content) }}{% endif %}", {"messages": MSGS}),
    ("global:raise_line", "line1\n{% if true %}\n\n{{ raise_exception('on line 4') }}\n{% endif %}", {}),
    ("global:range_too_big", "{{ range(200000) | length }}", {}),
    # undefined behaviour
    ("undef:print_iter_len", "[{{ u }}] [{% for x in u %}x{% endfor %}] {{ u | length }} {{ u is defined }} {{ u == u2 }} {{ u ~ 'x' }} {{ 'T' if u else 'F' }} {{ u | list }}", {}),
    ("undef:attr_of_undef", "{{ u.x }}", {}),
    ("undef:item_of_undef", "{{ u['x'] }}", {}),
    ("undef:arith", "{{ u + 1 }}", {}),
    ("undef:call", "{{ u() }}", {}),
    ("undef:missing_key_attr_chain", "{{ m.nope.deeper }}", {"m": MSGS[0]}),
    ("undef:missing_key_default", "{{ m.nope | default('d') }} {{ m['nope'] is defined }}", {"m": MSGS[0]}),
    ("undef:messages_empty", "{{ messages[0]['role'] }}", {"messages": []}),
    # type errors
    ("err:str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err:none_iter", "{% for x in n %}{% endfor %}", {"n": None}),
    ("err:div_zero", "{{ 1 / 0 }}", {}),
    ("err:lt_mixed", "{{ 1 < 'a' }}", {}),
    ("err:content_none_plus", "{{ 'x' + m.content }}", {"m": {"content": None}}),
    # syntax errors
    ("syntax:unknown_tag", "a\n{% frob %}", {}),
    ("syntax:unclosed_if", "{% if true %}\nno end\n", {}),
    ("syntax:unclosed_for", "{% for x in l %}{{ x }}", {}),
    ("syntax:bad_expr", "{{ 1 + }}", {}),
    ("syntax:unclosed_var", "text {{ x ", {}),
    ("syntax:unclosed_comment", "{# never closed", {}),
    ("syntax:endfor_without_for", "{% endfor %}", {}),
    ("syntax:unbalanced_paren", "{{ (1 + 2 }}", {}),
    ("syntax:break_outside_loop", "{% break %}", {}),
]


def construct_cases():
    return [make_case(f"construct:{n}", v, template=t) for n, t, v in CONSTRUCTS]


def main():
    cases = real_template_cases() + construct_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    out = os.path.join(FIX, "cases.json")
    with open(out, "w", encoding="utf-8") as f:   # one case per line, compact
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                                    for c in cases) + "\n]\n")
    n_err = sum("error" in c for c in cases)
    print(f"{out}: {len(cases)} cases ({n_err} errors), {os.path.getsize(out)} bytes, "
          f"engine: {ENGINE}, jinja2 {jinja2.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
