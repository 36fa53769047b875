"""All the mocked clouds at once, and the ``[providers.*]`` tables that point a broker at them."""
from __future__ import annotations

from typing import Any

from broker_sandbox.aws import AwsCloud
from broker_sandbox.azure import FakeArm
from broker_sandbox.azure_market import FakeRetailPrices
from broker_sandbox.gcp import FakeGcpCompute
from broker_sandbox.lambda_cloud import API_KEY as LAMBDA_API_KEY
from broker_sandbox.lambda_cloud import FakeLambdaCloud

AZ_SUB = "3f2b1c9e-5d4a-4e8b-9c7d-0a1b2c3d4e5f"
AZ_SUBNET = (f"/subscriptions/{AZ_SUB}/resourceGroups/net-rg/providers/Microsoft.Network/"
             "virtualNetworks/gpu-vnet/subnets/nodes")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBroKerTestKey broker@test"


class Clouds:
    """The fakes (three clouds, Lambda Cloud when asked), and the ``[providers.*]`` tables that point a broker at them (every API
    a broker calls, the market refresh's included: Azure's Retail Prices API is a fake too)."""

    def __init__(self, *, with_lambda: bool = False) -> None:
        self.aws = AwsCloud().start()
        self.gcp = FakeGcpCompute().start()
        self.azure = FakeArm().start()
        self.azure_retail = FakeRetailPrices().start()
        # Lambda Cloud joins when asked (``broker sandbox`` does): the suite's three-cloud tests
        # rank offers among the three.
        self.lambda_cloud = FakeLambdaCloud().start() if with_lambda else None

    def _fakes(self) -> tuple:
        return tuple(c for c in (self.aws, self.gcp, self.azure, self.azure_retail, self.lambda_cloud) if c)

    def stop(self) -> None:
        for c in self._fakes():
            c.stop()

    def reset(self) -> None:
        for c in self._fakes():
            c.reset()

    def client_env(self) -> dict[str, str]:
        """Environment a broker process needs for these clouds (fake credentials only)."""
        env = AwsCloud.client_env()
        if self.lambda_cloud is not None:
            env["LAMBDA_API_KEY"] = LAMBDA_API_KEY
        return env

    def provider_tables(self, **timeouts: Any) -> dict[str, dict[str, Any]]:
        return {
            "aws": self.aws.provider_settings(["us-east-1", "us-west-2"], credentials="anonymous",
                                              **timeouts),
            "gcp": {"enabled": True, "project": "test-project", "regions": ["us-central1", "europe-west4"],
                    "api_endpoint": self.gcp.url, "credentials": "anonymous", "timeout_s": 5},
            "azure": {"enabled": True, "subscription_id": AZ_SUB, "resource_group": "broker-rg",
                      "regions": ["eastus", "westeurope"], "base_url": self.azure.url, "credentials": "anonymous",
                      "subnet_id": AZ_SUBNET, "ssh_public_key": SSH_KEY, "poll_interval_s": 0, "retries": 0,
                      "timeout_s": 5, "operation_timeout_s": 20, "retail_prices_url": self.azure_retail.url},
            **({"lambda": self.lambda_cloud.provider_settings()} if self.lambda_cloud else {}),
        }

    def alive_instances(self) -> dict[str, list]:
        """What exists server-side and is not terminated, per cloud."""
        aws = [i for i in self.aws.instances() if i.get("state") not in ("terminated", "shutting-down")]
        gcp = [i for i in self.gcp.instances() if i.get("status") not in ("TERMINATED", "STOPPING")]
        azure = self.azure.instances()
        out = {"aws": aws, "gcp": gcp, "azure": azure}
        if self.lambda_cloud is not None:
            out["lambda"] = self.lambda_cloud.instances()
        return out
