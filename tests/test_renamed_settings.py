"""Issue 42 point 5: one name per meaning for the default token budgets. The policies' TPM reservation is
`reserve_completion_tokens`, the engine's answer length `max_tokens_when_unset`; the old name both carried,
`default_max_tokens`, is still read (YAML, LLMGW_* variables, stored policies, engine options)."""

from pathlib import Path

import pytest

from backends.local_engine import cli
from backends.local_engine.config import EngineSettings
from backends.local_engine.server.serve import settings_from
from core.renamed import accepted_names, old_names
from gateway.settings import Settings
from policies.config import PoliciesSettings
from policies.policy import Policy


@pytest.mark.parametrize("name", ["RESERVE_COMPLETION_TOKENS", "DEFAULT_MAX_TOKENS"])
def test_policies_reservation_from_the_environment_under_either_name(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"LLMGW_POLICIES__{name}", "2048")
    assert Settings().policies.reserve_completion_tokens == 2048


@pytest.mark.parametrize("name", ["MAX_TOKENS_WHEN_UNSET", "DEFAULT_MAX_TOKENS"])
def test_engine_answer_length_from_the_environment_under_either_name(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"LLMGW_ENGINE__{name}", "64")
    assert Settings().engine.max_tokens_when_unset == 64
    args = cli.build_parser().parse_args(["serve"])
    assert settings_from(args, {f"LLMGW_ENGINE__{name}": "32"}).max_tokens_when_unset == 32


def test_old_names_in_the_yaml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "llmgw.yaml"
    config.write_text(
        "policies: {default_max_tokens: 512}\n"
        "engine: {default_max_tokens: 100}\n"
        "models:\n"
        "  - name: tiny\n"
        "    deployments:\n"
        "      - {name: e, backend: local_engine, model: m, engine: {default_max_tokens: 50}}\n"
    )
    monkeypatch.setenv("LLMGW_CONFIG_FILE", str(config))
    settings = Settings()
    assert settings.policies.reserve_completion_tokens == 512
    assert settings.engine.max_tokens_when_unset == 100
    deployment_engine = settings.models[0].deployments[0].engine
    assert EngineSettings.model_validate(deployment_engine).max_tokens_when_unset == 50


def test_a_stored_policy_with_the_old_name_reads_and_is_written_under_the_new_one() -> None:
    policy = Policy.model_validate({"default_max_tokens": 300})
    assert policy.reserve_completion_tokens == 300
    dumped = policy.model_dump()
    assert dumped["reserve_completion_tokens"] == 300 and "default_max_tokens" not in dumped
    assert Policy.model_validate(dumped) == policy
    assert Policy(reserve_completion_tokens=7).reserve_completion_tokens == 7


def test_the_new_name_wins_over_the_old_and_misspellings_still_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    both = PoliciesSettings.model_validate({"reserve_completion_tokens": 1, "default_max_tokens": 2})
    assert both.reserve_completion_tokens == 1
    config = tmp_path / "llmgw.yaml"
    config.write_text("policies: {default_max_tokens: 512}\n")  # the file's old name, the environment's new
    monkeypatch.setenv("LLMGW_CONFIG_FILE", str(config))
    monkeypatch.setenv("LLMGW_POLICIES__RESERVE_COMPLETION_TOKENS", "600")
    assert Settings().policies.reserve_completion_tokens == 600
    # an engine child inherits the operator's old variable beside the gateway's resolved new one
    environ = {"LLMGW_ENGINE__DEFAULT_MAX_TOKENS": "9", "LLMGW_ENGINE__MAX_TOKENS_WHEN_UNSET": "8"}
    assert settings_from(cli.build_parser().parse_args(["serve"]), environ).max_tokens_when_unset == 8
    with pytest.raises(ValueError, match="default_max_token"):
        PoliciesSettings.model_validate({"default_max_token": 2})


def test_renamed_fields_list_their_old_names() -> None:
    assert old_names(PoliciesSettings.model_fields["reserve_completion_tokens"]) == ["default_max_tokens"]
    assert old_names(PoliciesSettings.model_fields["window_s"]) == []
    assert {"max_tokens_when_unset", "default_max_tokens", "dtype"} <= accepted_names(EngineSettings)


async def test_policies_are_stored_under_the_former_name_for_replicas_of_the_previous_release(
    tmp_path,
) -> None:
    """An older replica refuses keys it does not know: the row keeps `default_max_tokens` for this release,
    and this release reads it back as reserve_completion_tokens (the admin API answers the new name)."""
    from policies.policy import Policy
    from policies.provision import open_store
    from tests.policies_support import Database, make_settings

    settings = make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/r.db", None))
    async with open_store(settings) as store:
        row = await store.create_policy("p", Policy(reserve_completion_tokens=77))
        assert row.spec["default_max_tokens"] == 77 and "reserve_completion_tokens" not in row.spec
        stored = await store.get_policy(row.id)
    assert Policy.model_validate(stored.spec).reserve_completion_tokens == 77
