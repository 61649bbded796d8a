from __future__ import annotations

from pathlib import Path

import pytest

from textbook_chat.core import resources
from textbook_chat.core.settings import Secret, Settings, SettingsError


def test_defaults_follow_the_design_table() -> None:
    settings = Settings.from_env({})
    assert settings.database_url is None
    assert settings.embedder == "local"
    assert settings.chat_model == "gpt-4o-mini"
    assert settings.rate_limit_anon == "10/hour" and settings.rate_limit_user == "50/hour"
    assert settings.qdrant_path == Path("data/qdrant") and settings.qdrant_collection == "textbook"
    assert settings.session_retention_days == 30
    assert (settings.llm_timeout_s, settings.db_timeout_s, settings.qdrant_timeout_s) == (20.0, 2.0, 2.0)
    assert settings.log_level == "info" and settings.log_format == "json"


def test_an_openai_key_switches_the_default_embedder_to_openai() -> None:
    assert Settings.from_env({"OPENAI_API_KEY": "sk-test"}).embedder == "openai"
    assert Settings.from_env({"OPENAI_API_KEY": "sk-test", "EMBEDDER": "local"}).embedder == "local"


def test_secrets_never_print() -> None:
    settings = Settings.from_env({"OPENAI_API_KEY": "sk-very-secret", "AUTH_JWT_SECRET": "jwt-secret"})
    assert "sk-very-secret" not in repr(settings) and "jwt-secret" not in str(settings)
    assert isinstance(settings.openai_api_key, Secret) and settings.openai_api_key.reveal() == "sk-very-secret"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("RATE_LIMIT_ANON", "abc", "RATE_LIMIT_ANON='abc' is not valid"),
        ("DATABASE_URL", "mysql://localhost/x", "DATABASE_URL='mysql://localhost/x' is not valid"),
        ("DATABASE_URL", "postgresql://h:notaport/x", "DATABASE_URL"),
        ("REDIS_URL", "localhost:6379", "REDIS_URL"),
        ("LLM_TIMEOUT_S", "-1", "LLM_TIMEOUT_S='-1' is not valid: must be at least"),
        ("DB_TIMEOUT_S", "soon", "DB_TIMEOUT_S='soon' is not valid: expected a number"),
        ("SESSION_RETENTION_DAYS", "1.5", "SESSION_RETENTION_DAYS='1.5' is not valid: expected an integer"),
        ("EMBEDDER", "bert", "EMBEDDER='bert' is not valid: expected one of openai, local"),
        ("LOG_LEVEL", "loud", "LOG_LEVEL"),
        ("TRUSTED_PROXIES", "10.0.0.0/33", "TRUSTED_PROXIES"),
        ("ALLOWED_ORIGINS", "not an origin", "ALLOWED_ORIGINS"),
        ("BOOK_BASE_URL", "ftp://book", "BOOK_BASE_URL"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_lists_and_networks_are_parsed() -> None:
    settings = Settings.from_env(
        {
            "ALLOWED_ORIGINS": "https://book.example.org, http://localhost:3000/",
            "TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8",
            "BOOK_BASE_URL": "https://book.example.org/",
        }
    )
    assert settings.allowed_origins == ("https://book.example.org", "http://localhost:3000")
    assert [str(n) for n in settings.trusted_proxies] == ["127.0.0.1/32", "10.0.0.0/8"]
    assert settings.book_base_url == "https://book.example.org"


def test_the_installed_command_keeps_its_data_in_the_per_user_folder_and_reads_the_wheels_faq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "textbook_chat"
    (package / "_bundled").mkdir(parents=True)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    installed = resources.locate(package)
    settings = Settings.from_env({}, resources=installed)
    assert settings.data_dir == tmp_path / "xdg" / "textbook-chat"
    assert settings.qdrant_path == tmp_path / "xdg" / "textbook-chat" / "qdrant"
    assert settings.faq_path == package / "_bundled" / "faq" / "faq.json"
    assert Settings.from_env({"DATA_DIR": "/srv/tc"}, resources=installed).data_dir == Path("/srv/tc")


def test_from_a_checkout_data_stays_in_dot_data_and_the_faq_is_the_repositorys() -> None:
    settings = Settings.from_env({})
    assert settings.data_dir == Path("data") and settings.qdrant_path == Path("data/qdrant")
    assert settings.faq_path == resources.locate().faq and settings.faq_path.is_file()


def test_data_dir_moves_the_embedded_index_unless_qdrant_path_is_set() -> None:
    assert Settings.from_env({"DATA_DIR": "/srv/tc"}).qdrant_path == Path("/srv/tc/qdrant")
    assert Settings.from_env({"DATA_DIR": "/srv/tc", "QDRANT_PATH": "/q"}).qdrant_path == Path("/q")
    assert Settings.from_env({"DATA_DIR": "/srv/tc", "QDRANT_PATH": " "}).qdrant_path == Path("/srv/tc/qdrant")


def test_blank_values_count_as_unset() -> None:
    assert Settings.from_env({"DATABASE_URL": "  ", "LLM_TIMEOUT_S": ""}).database_url is None
