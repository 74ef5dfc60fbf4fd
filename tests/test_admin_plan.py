"""POST /admin/v1/plan gives what `llmgw plan` prints for the same inputs; bad input gets a 4xx in OpenAI's shape."""

import json

import pytest

from gateway.cli import main
from tests.policies_support import ADMIN_TOKEN, Database, admin_client, make_settings
from tests.test_plan import LLAMA_70B

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def admin(tmp_path):
    async with admin_client(make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/a.db", None))) as (
        client,
        services,
    ):
        yield client


async def test_the_route_answers_as_the_cli(admin, tmp_path, capsys) -> None:
    body = {"config": LLAMA_70B, "dtype": "fp16", "gpu": "H100", "gpus_per_replica": 4, "rate": 3,
            "input_mean": 2000, "output_mean": 300, "ttft_slo_ms": 2000, "itl_slo_ms": 50, "sequence_tokens": 8192,
            "capacity_rps": 1.5, "unloaded_ttft_p90_ms": 700}  # fmt: skip
    response = await admin.post("/admin/v1/plan", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    routed = response.json()
    assert routed["plan"]["kv_bytes_per_token"] == 327_680 and routed["plan"]["replicas"] >= 1
    assert "queueing from the measured service rate and TTFT" in routed["plan"]["notes"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_70B))
    flags = ["plan", "--config", str(config), "--dtype", "fp16", "--gpu", "H100", "--gpus-per-replica", "4",
             "--rate", "3", "--input-mean", "2000", "--output-mean", "300", "--ttft-slo-ms", "2000",
             "--itl-slo-ms", "50", "--sequence-tokens", "8192", "--capacity-rps", "1.5",
             "--unloaded-ttft-p90-ms", "700"]  # fmt: skip
    assert main(flags) == 0
    assert json.loads(capsys.readouterr().out) == routed


@pytest.mark.parametrize(
    "body",
    [{}, {"shape": {"layers": 80, "kv_heads": 8, "head_dim": 128}, "config": LLAMA_70B},
     {"config": {"hidden_size": 10}}, {"shape": {"layers": 0, "kv_heads": 8, "head_dim": 128}},
     {"shape": {"layers": 8, "kv_heads": 8, "head_dim": 128}, "gpu": "TPU"}],
)  # fmt: skip
async def test_bad_plans_are_refused_in_openais_shape(admin, body) -> None:
    response = await admin.post("/admin/v1/plan", json=body, headers=AUTH)
    assert response.status_code in (400, 422), response.text  # 422: the body's schema, as every admin route
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert (await admin.post("/admin/v1/plan", json=body)).status_code == 401
