"""Chat rendering and loss masks of `ftune tokenize --data` against an independent reference.

Reference text: the Jinja chat template rendered as transformers' apply_chat_template does
(formats.md 7.1): jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
with the loopcontrols extension, a json.dumps `tojson` filter, the `raise_exception` global,
`bos_token`/`eos_token` and add_generation_prompt=False. Reference ids: the `tokenizers`
package on that text with add_special_tokens=False (chat templates write BOS themselves,
formats.md 8.2), or add_special_tokens=True for the Stanford Alpaca prompt and the plain
text / prompt-completion schemas (TRL, Stanford Alpaca train.py).

Reference mask (computed from the rendered text, not from ftune's segments): for every trained
assistant turn i, the trained characters are the assistant content as the template writes it
(trimmed where the template trims it) followed by its end-of-turn token; the turn's text is
render(messages[:i+1]) minus render(messages[:i]), and the trained string must be its end
(before the template's untrained tail: "\n" after <|im_end|> in ChatML). A token is trained
when its `tokenizers` character offsets overlap a trained span (transformers'
return_assistant_tokens_mask rule); labels are the token id there and -100 elsewhere.

Templates: Llama-3 (tests/fixtures/tokenizers/llama3, the Instruct form of its template),
Llama-2-chat (tests/fixtures/tokenizers/llama2 has no chat_template: --chat-template llama2,
and auto-detected from a copy whose tokenizer_config carries the meta-llama template), Mistral
(auto-detected), ChatML with template markers that are plain text for the tokenizer (mask
boundaries inside tokens), the Stanford Alpaca prompt (formats.md 8.1) and SmolLM2's ChatML
with its default system turn from the example GGUF (skipped if it cannot be fetched).
"""
import json
import shutil

import pytest

jinja2 = pytest.importorskip("jinja2")
tokenizers = pytest.importorskip("tokenizers")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from cli_helpers import ROOT, SEED_DATA, TOKENIZERS, run_ftune  # noqa: E402
from gen_helpers import example_or_skip  # noqa: E402
# the Stanford Alpaca prompts (formats.md 8.1)
from tok_helpers import PROMPT_INPUT, PROMPT_NO_INPUT  # noqa: E402

LLAMA3 = TOKENIZERS / "llama3"
LLAMA2 = TOKENIZERS / "llama2"
ZH_DATA = ROOT / "examples" / "data" / "alpaca-zh" / "alpaca_zh_1000.json"

# ---- templates (verbatim sources) --------------------------------------------------------------

# Meta-Llama-3-8B-Instruct (formats.md 7.2). The fixture's tokenizer_config.json (base model
# repository) holds the same template except that it appends the assistant header without the
# add_generation_prompt guard; test_llama3_fixture_template_is_instruct_form checks that.
LLAMA3_INSTRUCT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# meta-llama/Llama-2-{7,13}b-chat-hf tokenizer_config.json (as quoted in llama.cpp's chat template
# tests); the backslash-n inside the Jinja string literals are Jinja escapes.
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
    "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}")
# Mistral-7B-Instruct v0.1/v0.2 (formats.md 7.2)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}")
# ChatML (formats.md 7.2)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
# Mistral's later templates, as llama.cpp's tests/test-chat-template.cpp quotes them: "v3"
# (Mistral-Large-Instruct-2407; Mistral-7B-Instruct-v0.3 has the same), "v3-tekken"
# (Mistral-Nemo-Instruct-2407) and "v7" (Mistral-Large-Instruct-2411).
MISTRAL_V3 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}"""
# v3-tekken as quoted there differs from v3 in exactly these six places
MISTRAL_TEKKEN = MISTRAL_V3
for _v3, _tk in (('"[AVAILABLE_TOOLS] ["', '"[AVAILABLE_TOOLS]["'),
                 ('"[INST] " + system_message', '"[INST]" + system_message'),
                 ('"[INST] " + message["content"]', '"[INST]" + message["content"]'),
                 ('{%- elif message.tool_calls is defined and message.tool_calls is not none %}\n'
                  '        {{- "[TOOL_CALLS] [" }}',
                  '{%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n'
                  '        {{- "[TOOL_CALLS][" }}'),
                 ('{{- " " + message["content"]|trim + eos_token}}', '{{- message["content"] + eos_token}}'),
                 ("""{{- '[TOOL_RESULTS] {"content": '""", """{{- '[TOOL_RESULTS]{"content": '""")):
    assert MISTRAL_TEKKEN.count(_v3) == 1, _v3
    MISTRAL_TEKKEN = MISTRAL_TEKKEN.replace(_v3, _tk)
MISTRAL_V7 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
              "{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}"
              "{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}"
              "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + eos_token }}"
              "{% else %}{{ raise_exception('Only user, system and assistant roles are supported!') }}"
              "{% endif %}{% endfor %}")
# Mistral-Small-24B-Instruct-2501's form of v7 (no spaces, its own default system prompt), with
# the default text shortened, as quoted in a third-party test.
MISTRAL_SMALL3 = ("{%- set today = strftime_now(\"%Y-%m-%d\") %}\n{%- set default_system_message = "
                  "\"You are Mistral Small 3. The current date is \" + today + \".\" %}\n\n"
                  "{{- bos_token }}\n\n{%- if messages[0]['role'] == 'system' %}\n"
                  "    {%- set system_message = messages[0]['content'] %}\n"
                  "    {%- set loop_messages = messages[1:] %}\n{%- else %}\n"
                  "    {%- set system_message = default_system_message %}\n"
                  "    {%- set loop_messages = messages %}\n{%- endif %}\n"
                  "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}\n\n"
                  "{%- for message in loop_messages %}\n    {%- if message['role'] == 'user' %}\n"
                  "        {{- '[INST]' + message['content'] + '[/INST]' }}\n"
                  "    {%- elif message['role'] == 'system' %}\n"
                  "        {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}\n"
                  "    {%- elif message['role'] == 'assistant' %}\n"
                  "        {{- message['content'] + eos_token }}\n    {%- else %}\n"
                  "        {{- raise_exception('Only user, system and assistant roles are supported!') }}\n"
                  "    {%- endif %}\n{%- endfor %}")
# Zephyr / TinyLlama-1.1B-Chat-v1.0 (formats.md 7.2; the newlines are the template's own, inside
# and between the tags)
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
          "{{ '<|user|>\n' + message['content'] + eos_token }}\n"
          "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
          "{% elif message['role'] == 'assistant' %}\n"
          "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
          "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
          "{% endfor %}")
# Llama-3.2-1B/3B-Instruct (meta-llama tokenizer_config.json, as quoted verbatim in third-party
# test fixtures); Llama-3.1's differs only in tools branches not taken here and in date_string
# ("26 Jul 2024" without strftime_now, which this environment does not define).
LLAMA32 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"""
# Qwen3 (Qwen/Qwen3-* tokenizer_config.json, the revision that tests `content is string`; as
# quoted in TRL users' code). The tools branch is never taken here (no `tools` passed).
QWEN3 = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n"
    "    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n{%- endfor %}\n"
    "{%- for message in messages %}\n    {%- if message.content is string %}\n"
    "        {%- set content = message.content %}\n    {%- else %}\n        {%- set content = '' %}\n"
    "    {%- endif %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is string %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n"
    "            {%- if '</think>' in content %}\n"
    "                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}")

# How each template writes a trained assistant turn: (trained string, untrained tail after it)
TRAINED = {
    "llama3": lambda c, eos: (c.strip() + "<|eot_id|>", ""),
    "llama2": lambda c, eos: (" " + c.strip() + " " + eos, ""),
    "mistral": lambda c, eos: (c + eos, ""),
    "chatml": lambda c, eos: (c + "<|im_end|>", "\n"),
    "zephyr": lambda c, eos: (c + eos, "\n"),
    "mistral-v3": lambda c, eos: (" " + c.strip() + eos, ""),
    "mistral-tekken": lambda c, eos: (c + eos, ""),
    "mistral-v7": lambda c, eos: (" " + c + eos, ""),
    "mistral-v7-tekken": lambda c, eos: (c + eos, ""),
}

# ---- conversations ----------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "  Capital of France?  "},
     {"role": "assistant", "content": "  Paris.\n"},
     {"role": "user", "content": "And of Japan?"},
     {"role": "assistant", "content": "Tokyo — 東京 😀"}],
    [{"role": "user", "content": "Write a haiku about tabs\tand\nnewlines."},
     {"role": "assistant", "content": "Tabs\tline up\nnewlines fall\nspaces  wait"},
     {"role": "user", "content": "Again, in French."},
     {"role": "assistant", "content": "Les tabulations s'alignent, naïves à l'été."},
     {"role": "user", "content": "Und auf Deutsch?\r\n"},
     {"role": "assistant", "content": "\n\nTabulatoren — Größe ß.\n\n"}],
    [{"role": "system", "content": "\t Be terse. \n"},
     {"role": "user", "content": "مرحبا! Привет! 你好！"},
     {"role": "assistant", "content": "Hello in three scripts: مرحبا, Привет, 你好."}],
    # a turn with "weight": 0 (OpenAI) is rendered but not trained
    [{"role": "user", "content": "Say A."},
     {"role": "assistant", "content": "B", "weight": 0},
     {"role": "user", "content": "No, say A."},
     {"role": "assistant", "content": "A", "weight": 1}],
    # special-token text inside a user turn; an answer of digits and code
    [{"role": "user", "content": "What do </s>, <s> and <|eot_id|> mean in 123 tokens?"},
     {"role": "assistant", "content": "def f(x):\n    return x ** 2  # 12345"}],
    # whitespace-only assistant content: trimmed to nothing by llama3/llama2
    [{"role": "user", "content": "Reply with spaces only."},
     {"role": "assistant", "content": "   "}],
]
HAS_SYSTEM = [any(m["role"] == "system" for m in c) for c in CONVERSATIONS]


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


ENV = make_env()


def render(template, messages, bos, eos):
    return ENV.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=False)


def label_by_overlap(enc, spans):
    return [t if any(s < b and a < e for a, b in spans) else -100
            for t, (s, e) in zip(enc.ids, enc.offsets)]


def expected_chat(tok, template, kind, messages, bos, eos):
    """(ids, labels, text) of one conversation by the reference rules above."""
    text = render(template, messages, bos, eos)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        pre = render(template, messages[:i], bos, eos)
        upto = render(template, messages[:i + 1], bos, eos)
        assert upto.startswith(pre) and text.startswith(upto), "template output is not incremental"
        trained, tail = TRAINED[kind](m["content"], eos)
        turn = upto[len(pre):]
        assert turn.endswith(trained + tail), (turn, trained, tail)
        end = len(upto) - len(tail)
        spans.append((end - len(trained), end))
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, label_by_overlap(enc, spans), text


def expected_alpaca_prompt(tok, rec, eos):
    """Stanford Alpaca: prompt + output + eos, BOS from the post-processor, output + eos trained."""
    p = PROMPT_INPUT if rec.get("input") else PROMPT_NO_INPUT
    prompt = p.format(instruction=rec["instruction"], input=rec.get("input", ""))
    text = prompt + rec["output"] + eos
    enc = tok.encode(text, add_special_tokens=True)
    return enc.ids, label_by_overlap(enc, [(len(prompt), len(text))]), text


# ---- running ftune and comparing ----------------------------------------------------------------

def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


def ftune_rows(model, data, *extra):
    r = run_ftune(["tokenize", "--model", model, "--data", data, *extra], timeout=300)
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in r.stdout.splitlines()]


def compare(name, tok, rows, expected):
    """rows: ftune's; expected: [(ids, labels, text)]. Asserts identity, reports the first
    difference of each kind."""
    assert len(rows) == len(expected), f"{name}: ftune gave {len(rows)} rows for {len(expected)}"
    n_ids = n_trained = 0
    for k, (row, (ids, labels, text)) in enumerate(zip(rows, expected)):
        n_ids += len(ids)
        n_trained += sum(l != -100 for l in labels)
        if row["ids"] != ids:
            j = next((j for j in range(min(len(ids), len(row["ids"])))
                      if ids[j] != row["ids"][j]), min(len(ids), len(row["ids"])))
            pytest.fail(f"{name}: example {k}: ids differ at token {j}: ftune "
                        f"{row['ids'][j:j + 6]} vs reference {ids[j:j + 6]} "
                        f"({tok.decode(ids[max(0, j - 3):j + 3], skip_special_tokens=False)!r}); "
                        f"text {text!r}")
        assert any(l != -100 for l in labels), f"{name}: example {k}: nothing trained"
        if row["labels"] != labels:
            bad = [j for j in range(len(ids)) if row["labels"][j] != labels[j]]
            show = ", ".join(f"token {j} {tok.id_to_token(ids[j])!r}: ftune {row['labels'][j]} "
                             f"ref {labels[j]}" for j in bad[:6])
            pytest.fail(f"{name}: example {k}: {len(bad)} labels differ: {show}; text {text!r}")
    print(f"{name}: {len(rows)} examples, {n_ids} ids and labels identical, {n_trained} trained")


def tokenizer_dir(tmp, src, template=None, name="tok"):
    """A copy of a tokenizer folder, with tokenizer_config.json's chat_template replaced
    (or removed when template is None)."""
    d = tmp / name
    d.mkdir()
    shutil.copyfile(src / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def special_strings(model_dir):
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    tok_str = lambda v: v["content"] if isinstance(v, dict) else v  # noqa: E731
    return tok_str(cfg["bos_token"]), tok_str(cfg["eos_token"])


def sharegpt(conv, system_field=False):
    role = {"user": "human", "assistant": "gpt", "system": "system"}
    rec = {"conversations": [{"from": role[m["role"]], "value": m["content"]} for m in conv
                             if not (system_field and m["role"] == "system")]}
    if system_field:
        sys = [m["content"] for m in conv if m["role"] == "system"]
        if sys:
            rec["system"] = sys[0]
    return rec


def check_conversations(tmp, model, tok, template, kind, bos, eos, convs, extra=()):
    """messages schema and sharegpt schema (system as a turn and as the top-level field)."""
    exp = [expected_chat(tok, template, kind, c, bos, eos) for c in convs]
    rows = ftune_rows(model, write_jsonl(tmp / f"{kind}-messages.jsonl",
                                         [{"messages": c} for c in convs]), *extra)
    compare(f"{kind} messages", tok, rows, exp)
    # ShareGPT has no per-turn weight: those turns are trained there
    plain = [[{k: v for k, v in m.items() if k != "weight"} for m in c] for c in convs]
    exp = [expected_chat(tok, template, kind, c, bos, eos) for c in plain]
    for sysf in (False, True):
        rows = ftune_rows(model, write_jsonl(tmp / f"{kind}-sharegpt{int(sysf)}.jsonl",
                                             [sharegpt(c, sysf) for c in plain]), *extra)
        compare(f"{kind} sharegpt (system {'field' if sysf else 'turn'})", tok, rows, exp)


# ---- tests ------------------------------------------------------------------------------------

def test_llama3_fixture_template_is_instruct_form():
    cfg = json.loads((LLAMA3 / "tokenizer_config.json").read_text())
    gen = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    guarded = "{% if add_generation_prompt %}" + gen + "{% endif %}"
    assert cfg["chat_template"].endswith(gen)
    assert cfg["chat_template"][: -len(gen)] + guarded == LLAMA3_INSTRUCT


def test_llama3_messages_sharegpt(tmp_path):
    tok = tokenizers.Tokenizer.from_file(str(LLAMA3 / "tokenizer.json"))
    bos, eos = special_strings(LLAMA3)
    check_conversations(tmp_path, LLAMA3, tok, LLAMA3_INSTRUCT, "llama3", bos, eos, CONVERSATIONS)


def alpaca_to_messages(rec):
    """ftune's (and LLaMA-Factory's) alpaca -> chat conversion: system, history pairs, then
    user "instruction\\n\\ninput" (just the instruction when input is empty) and assistant
    "output"."""
    msgs = [{"role": "system", "content": rec["system"]}] if rec.get("system") else []
    for q, a in rec.get("history") or []:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    user = rec["instruction"] + ("\n\n" + rec["input"] if rec.get("input") else "")
    return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}]


def seed_records(n_seed, n_zh):
    seed = [json.loads(l) for l in SEED_DATA.read_text(encoding="utf-8").splitlines() if l.strip()]
    zh = json.loads(ZH_DATA.read_text(encoding="utf-8"))
    return seed[:n_seed] + zh[:n_zh]


HANDMADE_ALPACA = [
    {"instruction": "  Translate to German.  ", "input": "  Good morning \n", "output": " Guten Morgen "},
    {"instruction": "Continue.", "input": "", "output": "Done.", "system": "You are concise.",
     "history": [["Hi", "Hello!"], ["How are you?", " Fine, thanks. "]]},
]


def test_llama3_alpaca_records(tmp_path):
    """Alpaca records with a tokenizer that has a chat template: rendered as a user turn and
    an assistant turn (real seed and Chinese records, plus system/history/whitespace cases)."""
    tok = tokenizers.Tokenizer.from_file(str(LLAMA3 / "tokenizer.json"))
    bos, eos = special_strings(LLAMA3)
    recs = seed_records(40, 20) + HANDMADE_ALPACA
    exp = [expected_chat(tok, LLAMA3_INSTRUCT, "llama3", alpaca_to_messages(r), bos, eos)
           for r in recs]
    rows = ftune_rows(LLAMA3, write_jsonl(tmp_path / "alpaca.jsonl", recs))
    compare("llama3 alpaca records", tok, rows, exp)


def test_llama2_chat_forced(tmp_path):
    """The Llama-2 fixture has no chat_template: --chat-template llama2 against the
    meta-llama Llama-2-chat template."""
    cfg = json.loads((LLAMA2 / "tokenizer_config.json").read_text())
    assert "chat_template" not in cfg
    tok = tokenizers.Tokenizer.from_file(str(LLAMA2 / "tokenizer.json"))
    bos, eos = special_strings(LLAMA2)
    check_conversations(tmp_path, LLAMA2, tok, LLAMA2_CHAT, "llama2", bos, eos, CONVERSATIONS,
                        extra=("--chat-template", "llama2"))


def test_llama2_chat_detected(tmp_path):
    """The same with the meta-llama template in tokenizer_config.json and no flag."""
    d = tokenizer_dir(tmp_path, LLAMA2, LLAMA2_CHAT)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    exp = [expected_chat(tok, LLAMA2_CHAT, "llama2", c, bos, eos) for c in CONVERSATIONS]
    compare("llama2 detected", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in CONVERSATIONS])), exp)


def test_mistral_detected(tmp_path):
    """Mistral's template (no system role, content not stripped) in tokenizer_config.json."""
    d = tokenizer_dir(tmp_path, LLAMA2, MISTRAL)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = [c for c, s in zip(CONVERSATIONS, HAS_SYSTEM) if not s]
    exp = [expected_chat(tok, MISTRAL, "mistral", c, bos, eos) for c in convs]
    compare("mistral detected", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in convs])), exp)


@pytest.mark.parametrize("src", ["llama3", "llama2"])
def test_chatml_markers_as_text(tmp_path, src):
    """ChatML detected from tokenizer_config.json with tokenizers for which <|im_start|> and
    <|im_end|> are ordinary text: mask boundaries fall inside tokens, which are trained when
    they overlap trained text."""
    d = tokenizer_dir(tmp_path, TOKENIZERS / src, CHATML)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    exp = [expected_chat(tok, CHATML, "chatml", c, bos, eos) for c in CONVERSATIONS]
    compare(f"chatml on {src}", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in CONVERSATIONS])), exp)


@pytest.mark.parametrize("src,extra", [("llama2", ()), ("llama3", ("--chat-template", "alpaca"))],
                         ids=["llama2-auto", "llama3-forced"])
def test_alpaca_prompt(tmp_path, src, extra):
    """The Stanford Alpaca prompt: chosen automatically for the Llama-2 fixture (no chat
    template) and forced for Llama-3. Prompt + output + eos with BOS; output + eos trained."""
    model = TOKENIZERS / src
    tok = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    _, eos = special_strings(model)
    recs = seed_records(60, 30) + HANDMADE_ALPACA[:1]
    exp = [expected_alpaca_prompt(tok, r, eos) for r in recs]
    rows = ftune_rows(model, write_jsonl(tmp_path / "alpaca.jsonl", recs), *extra)
    compare(f"alpaca prompt ({src})", tok, rows, exp)


def test_text_and_prompt_completion(tmp_path):
    """TRL's non-conversational schemas (formats.md 8.2) on the Llama-2 fixture: text + eos,
    every token trained; prompt + completion + eos with the completion and eos trained; BOS
    from the post-processor; eos not appended twice."""
    tok = tokenizers.Tokenizer.from_file(str(LLAMA2 / "tokenizer.json"))
    _, eos = special_strings(LLAMA2)
    texts = ["The sky is blue.", "  Two spaces, 東京 and 😀.\n", "Already ends with eos" + eos]
    exp = []
    for t in texts:
        full = t if t.endswith(eos) else t + eos
        enc = tok.encode(full, add_special_tokens=True)
        exp.append((enc.ids, list(enc.ids), full))
    rows = ftune_rows(LLAMA2, write_jsonl(tmp_path / "text.jsonl", [{"text": t} for t in texts]))
    compare("text", tok, rows, exp)

    pcs = [("The sky is", " blue."), ("Q: 2+2?\nA:", " 4"), ("Say hi in Chinese:", " 你好")]
    exp = []
    for p, c in pcs:
        full = p + c + eos
        enc = tok.encode(full, add_special_tokens=True)
        exp.append((enc.ids, label_by_overlap(enc, [(len(p), len(full))]), full))
    rows = ftune_rows(LLAMA2, write_jsonl(tmp_path / "pc.jsonl",
                                          [{"prompt": p, "completion": c} for p, c in pcs]))
    compare("prompt-completion", tok, rows, exp)


@pytest.fixture(scope="module")
def example_gguf():
    return example_or_skip()


def test_smollm2_chatml_default_system(tmp_path, example_gguf):
    """SmolLM2's ChatML template from the example GGUF (its default system turn appears when
    the first message is not a system one), the `tokenizers` BPE built from the GGUF vocab."""
    gguf = pytest.importorskip("gguf")
    from tok_helpers import gguf_hf_tokenizer
    reader = gguf.GGUFReader(example_gguf)
    f = reader.fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    assert "You are a helpful AI assistant named SmolLM" in template
    toks = reader.fields["tokenizer.ggml.tokens"]

    def tok_str(key):
        i = int(reader.fields[key].parts[reader.fields[key].data[0]][0])
        return bytes(toks.parts[toks.data[i]]).decode()

    bos, eos = tok_str("tokenizer.ggml.bos_token_id"), tok_str("tokenizer.ggml.eos_token_id")
    tok = gguf_hf_tokenizer(example_gguf)
    check_conversations(tmp_path, example_gguf, tok, template, "chatml", bos, eos, CONVERSATIONS)
    recs = seed_records(20, 10) + HANDMADE_ALPACA
    exp = [expected_chat(tok, template, "chatml", alpaca_to_messages(r), bos, eos) for r in recs]
    compare("smollm2 alpaca records", tok,
            ftune_rows(example_gguf, write_jsonl(tmp_path / "alpaca.jsonl", recs)), exp)


# ---- Qwen3 ----------------------------------------------------------------------------------------

# Thinking blocks in content, history turns whose reasoning the template drops, tool results
# (one user turn per run of tool messages; a "<tool_response>" user text is not a query).
QWEN3_CONVERSATIONS = [
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"}],
    [{"role": "system", "content": "Think briefly."},
     {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "<think>\n\nIt is Paris.\n\n</think>\n\n\nParis."},
     {"role": "user", "content": "And Japan?"},
     {"role": "assistant", "content": "\n\n<think>Tokyo, 東京.</think>Tokyo."}],
    # "</think>" without "<think>"; two closing tags (reasoning before the first, answer after
    # the last); a leading newline kept in a history turn
    [{"role": "user", "content": "a"},
     {"role": "assistant", "content": "\nplain history answer"},
     {"role": "user", "content": "b"},
     {"role": "assistant", "content": "only reasoning</think>answer"}],
    [{"role": "user", "content": "c"},
     {"role": "assistant", "content": "<think>x</think>mid</think>\nend"}],
    # agentic: assistant turns after the last query keep their reasoning, consecutive tool results
    # share a user turn, a user "<tool_response>" wrapper does not count as the query
    [{"role": "user", "content": "Weather in Paris and Rome?"},
     {"role": "assistant", "content": "<think>\nCall the tool twice.\n</think>\n\nChecking."},
     {"role": "tool", "content": "{\"Paris\": 18}"},
     {"role": "tool", "content": "{\"Rome\": 24}"},
     {"role": "assistant", "content": "Now compare."},
     {"role": "user", "content": "<tool_response>\n{\"ok\": true}\n</tool_response>"},
     {"role": "assistant", "content": "<think>Rome is warmer.</think>Rome, 24 degrees.", "weight": 1}],
    [{"role": "user", "content": "Untrained history"},
     {"role": "assistant", "content": "<think>r</think>no", "weight": 0},
     {"role": "user", "content": "Trained"},
     {"role": "assistant", "content": "yes"}],
    # "reasoning_content" (string) replaces the parsed reasoning and keeps content whole; dropped
    # before the last query; an empty one after it (not last) gives no block; null is absent
    [{"role": "user", "content": "Q1"},
     {"role": "assistant", "content": "A1", "reasoning_content": "history thought"},
     {"role": "user", "content": "Q2"},
     {"role": "assistant", "content": "calling", "reasoning_content": ""},
     {"role": "tool", "content": "42"},
     {"role": "assistant", "content": "\nkept </think> whole", "reasoning_content": "\n\nfinal thought\n"}],
    [{"role": "user", "content": "Q"},
     {"role": "assistant", "content": "<think>parsed</think>A", "reasoning_content": None}],
]


def expected_qwen3(tok, messages, bos, eos):
    """(ids, labels, text) by the Qwen3 template. Its output is not incremental (the last
    assistant turn gets a thinking block that it loses once a user turn follows), so the trained
    spans come from the whole text: the n-th "<|im_start|>assistant\\n" belongs to the n-th
    assistant message, and everything after it up to and including its "<|im_end|>" is trained
    (the span of TRL's qwen3_training.jinja {% generation %}, without the trailing "\\n")."""
    text = render(QWEN3, messages, bos, eos)
    head, end_tok = "<|im_start|>assistant\n", "<|im_end|>"
    spans, pos = [], 0
    for m in messages:
        if m["role"] != "assistant":
            continue
        start = text.index(head, pos) + len(head)
        pos = text.index(end_tok, start) + len(end_tok)
        if m.get("weight", 1) != 0:
            spans.append((start, pos))
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, label_by_overlap(enc, spans), text


@pytest.mark.parametrize("src", ["llama3", "llama2"])
def test_qwen3_detected(tmp_path, src):
    """Qwen3's template in tokenizer_config.json selects the qwen3 renderer (with tokenizers
    for which the markers are text); every conversation, the thinking ones included, gives the
    template's ids and labels."""
    d = tokenizer_dir(tmp_path, TOKENIZERS / src, QWEN3)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = CONVERSATIONS + QWEN3_CONVERSATIONS
    texts = [render(QWEN3, c, bos, eos) for c in convs]
    assert "<think>\n\n</think>\n\n4<|im_end|>" in texts[0]       # empty block on a plain answer
    assert "It is Paris" not in texts[len(CONVERSATIONS) + 1]       # history reasoning dropped
    assert "Call the tool twice" in texts[len(CONVERSATIONS) + 4]  # kept after the last query
    assert "history thought" not in texts[len(CONVERSATIONS) + 6]
    assert "<think>\nfinal thought\n</think>\n\nkept </think> whole" in texts[len(CONVERSATIONS) + 6]
    exp = [expected_qwen3(tok, c, bos, eos) for c in convs]
    compare(f"qwen3 on {src}", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in convs])), exp)
    # ShareGPT and alpaca records go through the same renderer
    plain = [[{k: v for k, v in m.items() if k != "weight"} for m in c] for c in CONVERSATIONS]
    compare(f"qwen3 sharegpt on {src}", tok, ftune_rows(d, write_jsonl(
        tmp_path / "s.jsonl", [sharegpt(c) for c in plain])),
        [expected_qwen3(tok, c, bos, eos) for c in plain])
    recs = HANDMADE_ALPACA + seed_records(10, 5)
    compare(f"qwen3 alpaca on {src}", tok, ftune_rows(d, write_jsonl(tmp_path / "a.jsonl", recs)),
            [expected_qwen3(tok, alpaca_to_messages(r), bos, eos) for r in recs])


def test_qwen3_forced_and_chatml_unchanged(tmp_path):
    """--chat-template qwen3 on a tokenizer with plain ChatML; and plain ChatML (no <think>)
    is still detected as chatml, so its final turn gets no thinking block."""
    d = tokenizer_dir(tmp_path, LLAMA3, CHATML)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = QWEN3_CONVERSATIONS[:3]
    data = write_jsonl(tmp_path / "m.jsonl", [{"messages": c} for c in convs])
    compare("qwen3 forced", tok, ftune_rows(d, data, "--chat-template", "qwen3"),
            [expected_qwen3(tok, c, bos, eos) for c in convs])
    rows = ftune_rows(d, data)
    assert rows[0]["ids"] == tok.encode(render(CHATML, convs[0], bos, eos),
                                        add_special_tokens=False).ids


def test_reasoning_content_errors(tmp_path):
    """"reasoning_content" must be a string on an assistant message; the error names the file
    and line."""
    d = tokenizer_dir(tmp_path, LLAMA3, QWEN3)
    for msg in ({"role": "user", "content": "x", "reasoning_content": "r"},
                {"role": "assistant", "content": "x", "reasoning_content": 3}):
        conv = [{"role": "user", "content": "q"}, msg] if msg["role"] == "assistant" else [msg]
        data = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "user", "content": "ok"},
                                                                  {"role": "assistant", "content": "ok"}]},
                                                    {"messages": conv}])
        r = run_ftune(["tokenize", "--model", d, "--data", data], timeout=300)
        assert r.returncode == 1, r.stderr
        assert "bad.jsonl" in r.stderr and "line 2" in r.stderr and "reasoning_content" in r.stderr, r.stderr


# ---- Llama-3.1/3.2 -------------------------------------------------------------------------------

def test_llama32_detected(tmp_path):
    """Llama-3.2's template (the system turn with its date lines, always written; a first system
    message trimmed into it; tool results as JSON-quoted "ipython" turns) selects the llama3.1
    renderer; conversations, alpaca records and tool turns give the template's ids and labels."""
    d = tokenizer_dir(tmp_path, LLAMA3, LLAMA32)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    assert "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>" in \
        render(LLAMA32, CONVERSATIONS[0], bos, eos)
    check_conversations(tmp_path, d, tok, LLAMA32, "llama3", bos, eos, CONVERSATIONS)
    tools = [[{"role": "user", "content": "Weather?"},
              {"role": "assistant", "content": "Calling."},
              {"role": "tool", "content": '{"t": 18, "where": "Paris"}\n\tq"uote\\ 東京'},
              {"role": "assistant", "content": " 18 degrees. "}]]
    compare("llama3.2 tool turns", tok, ftune_rows(d, write_jsonl(
        tmp_path / "t.jsonl", [{"messages": c} for c in tools])),
        [expected_chat(tok, LLAMA32, "llama3", c, bos, eos) for c in tools])
    recs = HANDMADE_ALPACA + seed_records(10, 5)
    compare("llama3.2 alpaca", tok, ftune_rows(d, write_jsonl(tmp_path / "a.jsonl", recs)),
            [expected_chat(tok, LLAMA32, "llama3", alpaca_to_messages(r), bos, eos) for r in recs])
    # the Llama-3 (8B) template without the date lines stays llama3
    rows = ftune_rows(LLAMA3, write_jsonl(tmp_path / "m.jsonl", [{"messages": CONVERSATIONS[0]}]))
    assert rows[0]["ids"] == expected_chat(tok, LLAMA3_INSTRUCT, "llama3", CONVERSATIONS[0], bos, eos)[0]


def test_zephyr_detected(tmp_path):
    """Zephyr's template (TinyLlama-Chat) in tokenizer_config.json: <|role|>\\n content eos \\n,
    no BOS; the assistant content and its eos trained; messages, ShareGPT and alpaca records."""
    d = tokenizer_dir(tmp_path, LLAMA2, ZEPHYR)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    assert render(ZEPHYR, CONVERSATIONS[0], bos, eos) == "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n4</s>\n"
    check_conversations(tmp_path, d, tok, ZEPHYR, "zephyr", bos, eos, CONVERSATIONS)
    recs = HANDMADE_ALPACA + seed_records(10, 5)
    compare("zephyr alpaca", tok, ftune_rows(d, write_jsonl(tmp_path / "a.jsonl", recs)),
            [expected_chat(tok, ZEPHYR, "zephyr", alpaca_to_messages(r), bos, eos) for r in recs])




def expected_after_inst(tok, template, kind, messages, bos, eos):
    """(ids, labels, text) for the Mistral templates whose output is not incremental (v3 moves the
    system text to a final user turn): the n-th assistant turn follows the n-th "[/INST]"."""
    text = render(template, messages, bos, eos)
    spans, pos = [], 0
    for m in messages:
        if m["role"] == "user":
            pos = text.index("[/INST]", pos) + len("[/INST]")
        elif m["role"] == "assistant":
            trained, _ = TRAINED[kind](m["content"], eos)
            assert text.startswith(trained, pos), (text[pos:pos + 40], trained)
            if m.get("weight", 1) != 0:
                spans.append((pos, pos + len(trained)))
            pos += len(trained)
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, label_by_overlap(enc, spans), text


@pytest.mark.parametrize("kind,template", [("mistral-v3", MISTRAL_V3), ("mistral-tekken", MISTRAL_TEKKEN),
                                           ("mistral-v7", MISTRAL_V7)])
def test_mistral_later_templates(tmp_path, kind, template):
    """Mistral v3 / v3-tekken / v7 detected from the template: [INST] spacing, the assistant
    turn's leading space and trim, v7's [SYSTEM_PROMPT], and v3's system text, which only a final
    user turn carries (so a conversation ending with an answer has none)."""
    d = tokenizer_dir(tmp_path, LLAMA2, template)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    if kind != "mistral-v7":
        assert "You answer in one word." not in render(template, CONVERSATIONS[1], bos, eos)
        assert "You answer in one word.\n\nHi" in render(
            template, [CONVERSATIONS[1][0], {"role": "user", "content": "Hi"}], bos, eos)
    exp = [expected_after_inst(tok, template, kind, c, bos, eos) for c in CONVERSATIONS]
    compare(f"{kind} messages", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in CONVERSATIONS])), exp)
    recs = HANDMADE_ALPACA + seed_records(10, 5)
    compare(f"{kind} alpaca", tok, ftune_rows(d, write_jsonl(tmp_path / "a.jsonl", recs)),
            [expected_after_inst(tok, template, kind, alpaca_to_messages(r), bos, eos) for r in recs])
    # a tool turn is refused with the message's index
    bad = write_jsonl(tmp_path / "t.jsonl", [{"messages": [{"role": "user", "content": "q"},
                                                           {"role": "tool", "content": "1"},
                                                           {"role": "assistant", "content": "a"}]}])
    r = run_ftune(["tokenize", "--model", d, "--data", bad], timeout=300)
    assert r.returncode == 1 and "tool messages are not supported" in r.stderr, r.stderr


def test_mistral_small3(tmp_path):
    """Mistral Small 3's v7 form (no spaces): conversations with a system turn render as its
    template does; one without is refused (the template would write its own dated default)."""
    d = tokenizer_dir(tmp_path, LLAMA2, MISTRAL_SMALL3)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = [c for c, s in zip(CONVERSATIONS, HAS_SYSTEM) if s]
    ENV.globals["strftime_now"] = lambda fmt: "2025-01-30"  # transformers' global; only here
    try:
        exp = [expected_after_inst(tok, MISTRAL_SMALL3, "mistral-v7-tekken", c, bos, eos) for c in convs]
        assert "You are Mistral Small 3" in render(MISTRAL_SMALL3, CONVERSATIONS[0], bos, eos)
    finally:
        del ENV.globals["strftime_now"]
    compare("mistral small 3", tok, ftune_rows(d, write_jsonl(
        tmp_path / "m.jsonl", [{"messages": c} for c in convs])), exp)
    r = run_ftune(["tokenize", "--model", d, "--data", write_jsonl(
        tmp_path / "n.jsonl", [{"messages": CONVERSATIONS[0]}])], timeout=300)
    assert r.returncode == 1 and "default system prompt" in r.stderr and "line 1" in r.stderr, r.stderr



# ---- the Jinja engine: --chat-template jinja, and auto for templates without a built-in ------
# ftune renders the model's own template (src/template/jinja*.c) and derives the trained spans
# turn by turn (src/template/chat_jinja.c): the same rules as the built-in renderers, so the
# references above apply unchanged; Gemma's and Phi-3's turns are added here.
TRAINED["gemma"] = lambda c, eos: (c.strip() + "<end_of_turn>", "\n")
# Phi-3 writes the EOS after the last message only (when no generation prompt follows): it
# ends the last turn, trained with it
TRAINED["phi3"] = lambda c, eos: (c + "<|end|>", "\n")
TRAINED["phi4"] = lambda c, eos: (c + "<|im_end|>", "")
JINJA_FIXTURES = ROOT / "tests" / "fixtures" / "jinja" / "templates"


@pytest.mark.parametrize("kind,template,src,system", [
    ("llama3", LLAMA3_INSTRUCT, LLAMA3, True),
    ("llama2", LLAMA2_CHAT, LLAMA2, True),
    ("mistral", MISTRAL, LLAMA2, False),
    ("chatml", CHATML, LLAMA3, True),
    ("zephyr", ZEPHYR, LLAMA2, True),
])
def test_jinja_engine_same_as_builtin(tmp_path, kind, template, src, system):
    """--chat-template jinja on the templates the built-in renderers follow: the same ids and
    labels as the reference (messages and ShareGPT records)."""
    d = tokenizer_dir(tmp_path, src, template)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = [c for c, s in zip(CONVERSATIONS, HAS_SYSTEM) if system or not s]
    check_conversations(tmp_path, d, tok, template, kind, bos, eos, convs,
                        extra=("--chat-template", "jinja"))


def fixture_template(name):
    p = JINJA_FIXTURES / name
    if not p.exists():
        pytest.skip(f"{p} missing")
    return p.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind,file,system", [("gemma", "gemma-2-2b-it.jinja", False),
                                              ("phi3", "phi-3.5-mini-instruct.jinja", True),
                                              ("phi4", "phi-4.jinja", True)])
def test_jinja_engine_detected(tmp_path, kind, file, system):
    """Templates without a built-in renderer are rendered by the engine without a flag
    (auto); turns as the model's template writes them (Gemma: <start_of_turn>model, trimmed
    content, <end_of_turn>; Phi-3: <|assistant|>, <|end|>, the EOS after the last message)."""
    template = fixture_template(file)
    d = tokenizer_dir(tmp_path, LLAMA3, template)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    convs = [c for c, s in zip(CONVERSATIONS, HAS_SYSTEM) if system or not s]
    if kind == "phi3":  # a conversation that opens with the assistant: trained from its header on
        convs.append([{"role": "assistant", "content": "Hello! Ask me anything."},
                      {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because."}])
    exp = [(expected_phi3 if kind == "phi3" else expected_chat)(tok, template, kind, c, bos, eos)
           for c in convs]
    rows = ftune_rows(d, write_jsonl(tmp_path / "m.jsonl", [{"messages": c} for c in convs]))
    compare(f"{kind} (jinja, auto)", tok, rows, exp)


def expected_phi3(tok, template, kind, messages, bos, eos):
    """Phi-3's template ends the conversation with the EOS (no generation prompt): each
    trained turn is its content + <|end|>, and the last message's turn also trains the "\n"
    and the EOS after it (ftune trains a turn to the end of its text less trailing
    whitespace, and the EOS is part of the last turn's text)."""
    text = render(template, messages, bos, eos)
    assert text.endswith("<|end|>\n" + eos)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        upto = render(template, messages[:i + 1], bos, eos)[:-len(eos)]
        assert text.startswith(upto)
        trained, tail = TRAINED[kind](m["content"], eos)
        assert upto.endswith(trained + tail)
        end = len(text) if i == len(messages) - 1 else len(upto) - len(tail)
        spans.append((len(upto) - len(tail) - len(trained), end))
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, label_by_overlap(enc, spans), text


@pytest.mark.parametrize("file,warns", [("glm-4-9b-chat.jinja", True), ("gemma-3-it.jinja", False)])
def test_jinja_no_end_of_turn_warning(tmp_path, file, warns):
    """Training with a template that writes nothing after a reply (GLM-4) warns that the model
    does not learn to end one; a template with an end-of-turn token (Gemma-3) does not."""
    from cli_helpers import model_copy
    d = model_copy(tmp_path)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = fixture_template(file)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    data = write_jsonl(tmp_path / "m.jsonl", [{"messages": CONVERSATIONS[0]}] * 4)
    r = run_ftune(["train", "--model", d, "--data", data, "--out", tmp_path / "out", "--max-steps",
                   "1", "--seq-len", "64", "--eval-fraction", "0", "--threads", "1"])
    assert r.returncode == 0, r.stderr
    assert "template jinja" in r.stderr, r.stderr
    assert ("does not learn to end a reply" in r.stderr) == warns, r.stderr


GENERATION_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_jinja_generation_blocks_as_transformers(tmp_path):
    """A template with {% generation %} blocks: the trained tokens are transformers'
    apply_chat_template(return_assistant_tokens_mask=True) assistant_masks (an independent
    reference: transformers' own jinja2 AssistantTracker), ids as its tokenization."""
    transformers = pytest.importorskip("transformers")
    d = tokenizer_dir(tmp_path, LLAMA3, GENERATION_CHATML)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    convs = [[{k: v for k, v in m.items() if k != "weight"} for m in c] for c in CONVERSATIONS]
    exp = []
    for c in convs:
        out = hf.apply_chat_template(c, chat_template=GENERATION_CHATML, tokenize=True,
                                     return_dict=True, return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        exp.append((ids, [t if m else -100 for t, m in zip(ids, out["assistant_masks"])],
                    hf.decode(ids)))
    rows = ftune_rows(d, write_jsonl(tmp_path / "g.jsonl", [{"messages": c} for c in convs]),
                      "--chat-template", "jinja")
    compare("generation blocks (jinja)", tok, rows, exp)


def test_jinja_template_errors(tmp_path):
    """raise_exception and template syntax errors reach the user with the record's place."""
    d = tokenizer_dir(tmp_path, LLAMA2, LLAMA2_CHAT)
    bad = write_jsonl(tmp_path / "b.jsonl", [{"messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"}]}])
    r = run_ftune(["tokenize", "--model", d, "--data", bad, "--chat-template", "jinja"])
    assert r.returncode != 0 and "Conversation roles must alternate" in r.stderr, r.stderr
    assert "b.jsonl" in r.stderr and "line 1" in r.stderr, r.stderr
    # Qwen3's template drops the reasoning of earlier turns: two replies that read the same
    # must not pass for a turn whose text is intact (the first one is refused, not dropped)
    d3 = tokenizer_dir(tmp_path, LLAMA3, QWEN3, name="tok3")
    twice = write_jsonl(tmp_path / "q.jsonl", [{"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Sure."}]}])
    r = run_ftune(["tokenize", "--model", d3, "--data", twice, "--chat-template", "jinja"])
    assert r.returncode != 0 and "rewrites earlier turns" in r.stderr, r.stderr
    # a first assistant turn needs the template to render an empty conversation (Qwen2.5's
    # reads messages[0]): refused, rather than training its default system turn
    d4 = tokenizer_dir(tmp_path, LLAMA3, fixture_template("qwen2.5-instruct-chujiezheng.jinja"),
                       name="tok4")
    first = write_jsonl(tmp_path / "f.jsonl", [{"messages": [
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Yes."}]}])
    r = run_ftune(["tokenize", "--model", d4, "--data", first, "--chat-template", "jinja"])
    assert r.returncode != 0 and "starts with an assistant turn" in r.stderr, r.stderr
    d2 = tokenizer_dir(tmp_path, LLAMA2, "{% for m in messages %}{{ m.content }", name="tok2")
    ok = write_jsonl(tmp_path / "ok.jsonl", [{"messages": CONVERSATIONS[0]}])
    r = run_ftune(["tokenize", "--model", d2, "--data", ok])
    assert r.returncode != 0 and "chat_template:1:" in r.stderr, r.stderr


# ---- function calling: "tools", assistant "tool_calls", tool results (formats.md 8.1) -----------
# The built-in renderers write no tools, so a record with "tools" or "tool_calls" is rendered with
# the model's own template even where auto detection picks a built-in (llama3.1 for Llama-3.3's
# template: "Cutting Knowledge Date"; chatml for Qwen2.5's: "<|im_start|>" without "<think>");
# records without them in the same file keep the built-in (the same text). Reference text:
# transformers' own render_jinja_template (its jinja2 environment) with tools=record["tools"]
# and the messages as written. Reference mask, the turn rule written out: for a trained
# assistant message i, P = render(messages[:i], add_generation_prompt=True), Q =
# render(messages[:i+1]); the turn's text is Q after the longest common prefix of P and Q, up to
# Q's end less trailing whitespace (the "\n" after <|im_end|> is not trained), and the whole
# text starts with Q. Each trained text is also checked against the one written by hand from
# the template (TOOL_TRAINED): the tool-call JSON is trained with its end-of-turn token.

def tool_call(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    return {"id": cid, **c} if cid else c


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
TOOL_RECORDS = [
    # system, one call (content null, an id), a tool result with tool_call_id and name, answer
    {"tools": [WEATHER, CLOCK], "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("get_weather", {"city": "Paris", "unit": "celsius"}, "call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."}]},
    # two rounds: content "" on a weight-0 call turn, content absent on the next
    {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo, then in Tokyo?"},
        {"role": "assistant", "content": "", "weight": 0,
         "tool_calls": [tool_call("get_weather", {"city": "Oslo"})]},
        {"role": "tool", "content": "-3 C, snow"},
        {"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Tokyo"})]},
        {"role": "tool", "content": "18 C, rain"},
        {"role": "assistant", "content": "Oslo: -3 °C with snow. Tokyo: 18 °C with rain."}]},
    # tool_calls without tools; the call is the last (trained) turn
    {"messages": [{"role": "user", "content": "Time in UTC?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [tool_call("get_time", {"timezone": "UTC"})]}]},
    # no tools at all: the built-in renderer
    {"messages": [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]},
]
# Qwen2.5's template also writes several calls in one turn, text before them, JSON-string
# arguments (OpenAI's form, written through tojson as a string) and a run of tool results in
# one user turn (Llama-3.3's raises "only supports single tool-calls")
QWEN_TOOL_RECORDS = TOOL_RECORDS + [
    {"tools": [WEATHER, CLOCK], "messages": [
        {"role": "user", "content": "Weather and time in Lima?"},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            tool_call("get_weather", {"city": "Lima"}, "a"),
            tool_call("get_time", "{\"timezone\": \"America/Lima\"}", "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "24 C"},
        {"role": "tool", "tool_call_id": "b", "content": "14:05"},
        {"role": "assistant", "content": "24 °C, and it is 14:05."}]},
    # a tool result without tools or tool_calls: the built-in ChatML renderer would write an
    # <|im_start|>tool turn, Qwen2.5's template a <tool_response> in a user turn
    {"messages": [{"role": "user", "content": "Convert 3 km."},
                  {"role": "assistant", "content": "Converting."},
                  {"role": "tool", "content": "3 km = 1.86 mi"},
                  {"role": "assistant", "content": "That is 1.86 miles."}]},
]


def llama_trained(m):
    if "tool_calls" not in m:
        return m["content"].strip() + "<|eot_id|>"
    f = m["tool_calls"][0]["function"]
    return '{"name": "' + f["name"] + '", "parameters": ' + json.dumps(f["arguments"]) + "}<|eot_id|>"


def qwen_trained(m):
    turn = ("\n" + m["content"]) if m.get("content") else ""
    for c in m.get("tool_calls") or []:
        f = c["function"]
        turn += ('\n<tool_call>\n{"name": "' + f["name"] + '", "arguments": ' +
                 json.dumps(f["arguments"], ensure_ascii=False) + "}\n</tool_call>")
    # the "\n" after "<|im_start|>assistant" is the generation prompt's
    return (turn or "\n")[1:] + "<|im_end|>"


TOOL_TRAINED = {"llama-3.3-70b-instruct.jinja": llama_trained,
                "qwen2.5-instruct-chujiezheng.jinja": qwen_trained}


def expected_tools(tok, template, rec, bos, eos, trained_by_hand):
    """(ids, labels, text) of a record with tools by the turn rule above."""
    hf_render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

    def render_hf(msgs, gen):
        return hf_render(conversations=[msgs], tools=rec.get("tools"), chat_template=template,
                         add_generation_prompt=gen, bos_token=bos, eos_token=eos)[0][0]

    msgs = rec["messages"]
    text = render_hf(msgs, False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant" or m.get("weight", 1) == 0:
            continue
        p, q = render_hf(msgs[:i], True), render_hf(msgs[:i + 1], False)
        assert text.startswith(q), "template output is not incremental"
        s = next((k for k in range(min(len(p), len(q))) if p[k] != q[k]), min(len(p), len(q)))
        e = len(q.rstrip(" \t\r\n"))
        assert q[s:e] == trained_by_hand(m), (q[s:e], trained_by_hand(m))
        spans.append((s, e))
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, label_by_overlap(enc, spans), text


@pytest.mark.parametrize("file,records,forced", [
    ("llama-3.3-70b-instruct.jinja", TOOL_RECORDS, "llama3.1"),
    ("qwen2.5-instruct-chujiezheng.jinja", QWEN_TOOL_RECORDS, "chatml"),
])
def test_tool_calls_model_template(tmp_path, file, records, forced):
    """Records with tools, tool calls and tool results: ids and labels as transformers'
    rendering with tools=..., masks by the turn rule; the same with the detected built-in
    forced (--chat-template llama3.1 / chatml) and with --chat-template jinja."""
    template = fixture_template(file)
    d = tokenizer_dir(tmp_path, LLAMA3, template)
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    bos, eos = special_strings(d)
    exp = [expected_tools(tok, template, r, bos, eos, TOOL_TRAINED[file]) for r in records]
    marker = "Environment: ipython" if file.startswith("llama") else "<tools>"
    assert marker in exp[0][2] and '"get_weather"' in exp[0][2], exp[0][2]
    data = write_jsonl(tmp_path / "tools.jsonl", records)
    for extra in ((), ("--chat-template", forced), ("--chat-template", "jinja")):
        compare(f"{file} tools {' '.join(extra) or 'auto'}", tok, ftune_rows(d, data, *extra), exp)


def test_tool_calls_refused_without_template(tmp_path):
    """No template to write the tools: refused with the record's place and what to do; a
    forced built-in that is not the model's format too; malformed 'tools' named."""
    rec = TOOL_RECORDS[0]
    d = tokenizer_dir(tmp_path, LLAMA2, None)
    data = write_jsonl(tmp_path / "t.jsonl", [TOOL_RECORDS[3], rec])
    r = run_ftune(["tokenize", "--model", d, "--data", data])
    assert r.returncode != 0 and "'tools' or 'tool_calls'" in r.stderr, r.stderr
    assert "no chat_template" in r.stderr and "--chat-template" in r.stderr, r.stderr
    assert "t.jsonl" in r.stderr and "line 2" in r.stderr, r.stderr
    d2 = tokenizer_dir(tmp_path, LLAMA3, fixture_template("llama-3.3-70b-instruct.jinja"),
                       name="tok2")
    r = run_ftune(["tokenize", "--model", d2, "--data", data, "--chat-template", "chatml"])
    assert r.returncode != 0 and "'tools' or 'tool_calls'" in r.stderr, r.stderr
    assert "--chat-template auto or jinja" in r.stderr, r.stderr
    # "tools" as a JSON string (LLaMA-Factory's form) is parsed; broken JSON there is named
    bad = write_jsonl(tmp_path / "b.jsonl", [{**rec, "tools": json.dumps(rec["tools"])[:-1]}])
    r = run_ftune(["tokenize", "--model", d2, "--data", bad])
    assert r.returncode != 0 and "'tools' is a string that is not valid JSON" in r.stderr, r.stderr
    good = write_jsonl(tmp_path / "g.jsonl", [{**rec, "tools": json.dumps(rec["tools"])}])
    same = write_jsonl(tmp_path / "s.jsonl", [rec])
    assert ftune_rows(d2, good) == ftune_rows(d2, same)
