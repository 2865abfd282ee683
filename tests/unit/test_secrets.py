"""The secret rules (engine_adapters.secrets): what is a secret, what is not, and that every
masker removes the value while keeping what a reader needs (names, users, hosts, flags)."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapters import secrets as sec
from engine_adapters.secrets import MASK, is_secret_name, mask_argv, mask_env, mask_obj, mask_text, mask_url


@pytest.fixture(autouse=True)
def _fresh_memory() -> Iterator[None]:
    """Each test checks the rules alone, not values remembered from another test."""
    sec.forget_secrets()
    yield
    sec.forget_secrets()


SECRET_NAMES = [
    "HF_TOKEN", "OPENAI_API_KEY", "MY_PASSWORD", "DB_PASSWD", "X_AUTH", "SOME_CREDENTIAL", "AWS_SECRET_ACCESS_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "OAUTH_TOKEN", "GITHUB_TOKEN", "VLLM_API_KEY", "api_key", "apiKey", "APIKEY",
    "hfToken", "accessToken", "Authorization", "Proxy-Authorization", "X-Api-Key", "api-key", "hf-token", "token",
    "SECRET", "client_secret", "secret_name", "AUTH_HEADER", "BASIC_AUTH", "OPENAI_API_KEY_2", "PASSPHRASE",
    "Cookie", "credentials",
]
PLAIN_NAMES = [
    "max_tokens", "tokens_per_s", "num_tokens", "kv_cache", "tokenizer", "TOKENIZERS_PARALLELISM", "tokenizer_mode",
    "inter_token_latency_ms", "time_to_first_token_ms", "first_token_ms", "eos_token", "pad_token", "bos_token_id",
    "max_num_batched_tokens", "num_speculative_tokens", "shared_prefix_tokens", "output_tok_per_s", "author",
    "authority", "monkey", "hotkey", "keyboard", "keyfile", "ssl-keyfile", "HF_TOKEN_PATH", "API_KEY_ENV",
    "PWD", "PATH", "HOME", "VLLM_CPU_KVCACHE_SPACE", "sort_key", "cache_key", "public_key", "prefix_caching",
    "return-tokens-as-token-ids", "kv_cache_usage_pct", "generation_tokens", "prompt_tokens", "cache_salt", "",
    "key", "KEY", "keys",  # a record's generic field, e.g. a feature check's {"key": "prefix_caching"}
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)
    assert sec._STEM_RE.search(name), "mask_text skips text without a stem: every secret name needs one"


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_names_that_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)


_WORD = st.text(string.ascii_lowercase, min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORD, max_size=3), st.sampled_from(["key", "token", "secret", "password", "passwd", "credential",
                                                     "auth", "apikey"]),
       st.sampled_from(["_", "-", "."]), st.booleans())
def test_a_secret_word_last_is_a_secret_in_any_spelling(prefix: list[str], word: str, sep: str, upper: bool) -> None:
    """``<anything>_KEY``, ``<anything>-token``...: whatever the prefix, separator or case (unless the
    prefix says it is a language-model token or a lookup key, as in ``eos_token``)."""
    if prefix and prefix[-1] in sec._PLAIN_BEFORE.get(word, ()):
        return
    if not prefix and word == "key":  # a bare "key" names a record's field, not a secret
        return
    name = sep.join([*prefix, word])
    assert is_secret_name(name.upper() if upper else name)
    sec.forget_secrets()
    assert mask_text(f"{name}=s3cret-value") == f"{name}={MASK}"


@settings(max_examples=300, deadline=None)
@given(st.lists(_WORD.filter(lambda w: not any(s in w for s in ("key", "token", "secret", "passw", "credential",
                                                                  "auth", "cookie", "passphrase"))),
                min_size=1, max_size=4),
       st.sampled_from(["tokens", "token_ms", "tokens_per_s", "tokenizer", "cache", "kv"]))
def test_counts_and_figures_named_after_tokens_are_not_secrets(words: list[str], tail: str) -> None:
    """``max_tokens``, ``foo_tokens_per_s``, ``bar_tokenizer``: a figure or a setting, never masked."""
    assert not is_secret_name("_".join([*words, tail]))


def test_mask_env_masks_secret_names_and_credentials_in_other_values() -> None:
    env = {"HF_TOKEN": "hf_abc", "MY_PASSWORD": "pw", "PATH": "/usr/bin", "MAX_TOKENS": "32",
           "HTTP_PROXY": "http://me:proxypw@proxy:3128", "EMPTY_TOKEN": ""}
    assert mask_env(env) == {"HF_TOKEN": MASK, "MY_PASSWORD": MASK, "PATH": "/usr/bin", "MAX_TOKENS": "32",
                             "HTTP_PROXY": f"http://me:{MASK}@proxy:3128", "EMPTY_TOKEN": ""}
    assert mask_env(None) == {}


def test_mask_argv_masks_the_values_of_secret_flags_in_both_forms() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "k1", "--api-key=k2", "--hf-token", "k3", "--db-password=k4",
            "--client-secret", "k5", "--max-num-batched-tokens", "2048", "--tokenizer", "tok/dir",
            "--return-tokens-as-token-ids", "--port", "8000", "-e", "HF_TOKEN=k6", "-H", "Authorization: Bearer k7"]
    assert mask_argv(argv) == [
        "vllm", "serve", "m", "--api-key", MASK, f"--api-key={MASK}", "--hf-token", MASK, f"--db-password={MASK}",
        "--client-secret", MASK, "--max-num-batched-tokens", "2048", "--tokenizer", "tok/dir",
        "--return-tokens-as-token-ids", "--port", "8000", "-e", f"HF_TOKEN={MASK}", "-H",
        f"Authorization: Bearer {MASK}"]
    assert mask_argv(None) is None


def test_a_secret_flag_without_a_value_does_not_swallow_the_next_flag() -> None:
    assert mask_argv(["--hf-token", "--port", "1"]) == ["--hf-token", "--port", "1"]


@pytest.mark.parametrize(("url", "expected"), [
    ("http://user:s3cret@127.0.0.1:8000/v1", f"http://user:{MASK}@127.0.0.1:8000/v1"),
    ("https://u:p@ss:w@host/x?y=1", f"https://u:{MASK}@host/x?y=1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://user@host:1", "http://user@host:1"),
    ("http://host:1/v1?api_key=abc&model=m", f"http://host:1/v1?api_key={MASK}&model=m"),
    ("http://host:1/a?email=me@example.com", "http://host:1/a?email=me@example.com"),
])
def test_mask_url(url: str, expected: str) -> None:
    assert mask_url(url) == expected
    assert mask_text(f"cannot connect to {url}: refused") == f"cannot connect to {expected}: refused"


@pytest.mark.parametrize(("text", "expected"), [
    ("Authorization: Bearer abc.def-123", f"Authorization: Bearer {MASK}"),
    ('{"Authorization": "Basic dXNlcjpwdw=="}', f'{{"Authorization": "Basic {MASK}"}}'),
    ("sent bearer tok_99 to the server", f"sent bearer {MASK} to the server"),
    ("X-Api-Key: k123", f"X-Api-Key: {MASK}"),
    ("HF_TOKEN=hf_x OPENAI_API_KEY: sk-1", f"HF_TOKEN={MASK} OPENAI_API_KEY: {MASK}"),
    ("non-default args: {'model': 'm', 'api_key': ['k1'], 'max_num_seqs': 4}",
     f"non-default args: {{'model': 'm', 'api_key': [{MASK}], 'max_num_seqs': 4}}"),
    ("Namespace(api_key='k2', port=8000)", f"Namespace(api_key='{MASK}', port=8000)"),
    ('{"my_password": "p w", "n": 1}', f'{{"my_password": "{MASK}", "n": 1}}'),
    ("vllm serve m --api-key k3 --port 1", f"vllm serve m --api-key {MASK} --port 1"),
    ("vllm serve m --api-key=k4", f"vllm serve m --api-key={MASK}"),
    # Not secrets: figures, settings and ordinary log lines stay as they are.
    ("max_tokens=32 tokens_per_s: 12.5 num_tokens=3 kv_cache: 0.5", None),
    ("Maximum concurrency for 2048 tokens per request: 12.5x", None),
    ("GPU KV cache size: 12,345 tokens", None),
    ("eos_token_id=2 tokenizer: /models/x time: 12:00", None),
    ("Avg prompt throughput: 1.0 tokens/s, Running: 4 reqs", None),
    ("http://127.0.0.1:8000/v1/models", None),
    ("extra_args: --api-key is set by tunebench from the configuration", None),
    ("HF_TOKEN: not set, using anonymous access", None),
    ("", None),
])
def test_mask_text(text: str, expected: str | None) -> None:
    assert mask_text(text) == (text if expected is None else expected)


def test_masking_is_idempotent() -> None:
    text = "Authorization: Bearer x1 http://u:p@h/ HF_TOKEN=y2 --api-key z3"
    once = mask_text(text)
    assert mask_text(once) == once


def test_a_masked_value_is_masked_wherever_it_appears_again() -> None:
    mask_env({"HF_TOKEN": "hf_remembered_1"})
    assert mask_text("download failed for token hf_remembered_1 (401)") == f"download failed for token {MASK} (401)"
    sec.forget_secrets()
    assert "hf_remembered_1" in mask_text("hf_remembered_1")


def test_short_values_are_not_remembered() -> None:
    """A one-letter secret must not mask every 'a' in later text."""
    mask_env({"MY_PASSWORD": "a"})
    assert mask_text("a cat") == "a cat"


def test_mask_obj_walks_a_run_config_and_keeps_its_shape() -> None:
    config = {
        "name": "n", "engine": {"require_api_key": True, "tokenizer": "t", "runtime": {
            "env": {"HF_TOKEN": "e1", "MY_PASSWORD": "e2", "OPENAI_API_KEY": "e3", "X_AUTH": "e4",
                    "SOME_CREDENTIAL": "e5", "OMP_NUM_THREADS": "2"}}},
        "features": {"extra_args": ["--api-key", "e6", "--api-key=e7", "--max-num-seqs", "4"],
                     "max_num_batched_tokens": 2048},
        "workload": {"max_tokens": 16, "notes": "see http://u:e8@h:1/"},
        "headers": {"Authorization": "Bearer e9", "X-Api-Key": "e10"},
        "levels": [[1.5, 2.5], {"api_key": ["e11", "e12"]}],
        "endpoint": "http://u:e13@h:1",
    }
    masked = mask_obj(config)
    text = json.dumps(masked)
    for i in range(1, 14):
        assert f'"e{i}"' not in text and f":e{i}@" not in text and f"=e{i}" not in text, i
    assert masked["engine"]["require_api_key"] is True
    assert masked["engine"]["runtime"]["env"]["OMP_NUM_THREADS"] == "2"
    assert masked["features"]["extra_args"] == ["--api-key", MASK, f"--api-key={MASK}", "--max-num-seqs", "4"]
    assert masked["features"]["max_num_batched_tokens"] == 2048
    assert masked["workload"]["max_tokens"] == 16
    assert masked["levels"][0] == [1.5, 2.5]
    assert masked["endpoint"] == f"http://u:{MASK}@h:1"
    assert config["engine"]["runtime"]["env"]["HF_TOKEN"] == "e1"  # a copy: the input is untouched


_SECRET_VALUE = st.text(string.ascii_letters + string.digits + "_-.~+/", min_size=6, max_size=24).filter(
    lambda v: v.strip("-") == v)


@settings(max_examples=200, deadline=None)
@given(_SECRET_VALUE, st.sampled_from(SECRET_NAMES[:12]))
def test_every_form_of_a_secret_is_masked(value: str, name: str) -> None:
    """Whatever the value, none of the forms a user or a server writes it in lets it through."""
    sec.forget_secrets()
    forms = [f"{name}={value}", f"{name}: {value}", f'"{name}": "{value}"', f"'{name}': '{value}'",
             f"Authorization: Bearer {value}", f"http://user:{value}@host:1/v1", f"--api-key {value}",
             f"--api-key={value}"]
    for form in forms:
        assert value not in mask_text(f"line: {form} end"), form
    assert value not in json.dumps(mask_obj({name: value, "argv": ["x", "--hf-token", value]}))
    assert mask_env({name: value}) == {name: MASK}


def test_a_feature_checks_key_field_is_not_masked_nor_remembered() -> None:
    """A feature check names its feature under "key": masking the record must keep the feature's
    name, and must not teach the process to mask "prefix_caching" everywhere afterwards."""
    check = {"key": "prefix_caching", "requested": True, "status": "verified"}
    assert mask_obj(check) == check
    assert mask_text("feature prefix_caching=True: active") == "feature prefix_caching=True: active"
