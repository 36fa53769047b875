"""A long run's history, made up front (benchmarks/load.py ``--seed-terminated``,
``--seed-ended-leases``): what minutes of a soak cannot accumulate, in the mocked EC2 and in the
broker's store, so a short run shows what a long one's history costs."""
from __future__ import annotations

import time


def seed_terminated(clouds, owner: str, n: int) -> None:
    """``n`` instances carrying ``owner``'s tag, launched and terminated in the mocked EC2."""
    import boto3

    from providers.base import TAG_LEASE, TAG_OWNER

    table = clouds.provider_tables()["aws"]
    region = table["regions"][0]
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=table["endpoint_url"])
    tags = [{"ResourceType": "instance", "Tags": [{"Key": TAG_OWNER, "Value": owner},
                                                  {"Key": TAG_LEASE, "Value": "seed"}]}]
    for i in range(0, n, 200):
        count = min(200, n - i)
        ids = [r["InstanceId"] for r in ec2.run_instances(
            ImageId=table["image_id"][region], InstanceType="g5.xlarge", MinCount=count, MaxCount=count,
            TagSpecifications=tags)["Instances"]]
        ec2.terminate_instances(InstanceIds=ids)


def seed_ended_leases(url: str, n: int) -> None:
    """``n`` ended leases (and their events) in the store at ``url``, created over the last hours."""
    from sqlalchemy import insert

    from broker.lease import Lease
    from broker.store import LeaseEventRecord, LeaseRecord, Store

    store = Store(url)
    now = time.time()
    try:
        for start in range(0, n, 500):
            leases, events = [], []
            for i in range(start, min(n, start + 500)):
                at = now - 3 * 3600 + i * (3 * 3600 / max(n, 1))
                state = "released" if i % 10 else "failed"
                lease = Lease(lease_id=f"seed-{i:07d}", tenant="default", idempotency_key=f"seed-{i}", state=state,
                              provider=("aws", "gcp", "azure")[i % 3], region="us-east-1", instance_type="g5.xlarge",
                              market="on_demand", nodes=1, hourly_micros=1_006_000, client_token=f"seed-{i}-1",
                              created_at=at, updated_at=at + 5, state_since=at + 5, started_at=at + 1,
                              ended_at=at + 5, accrued_at=at + 5, accrued_micros=1_400)
                leases.append(lease.to_row())
                events += [{"lease_id": lease.lease_id, "at": at + k, "kind": "state_changed", "from_state": a,
                            "to_state": b, "message": "load test", "data": "{}"}
                           for k, (a, b) in enumerate((("", "requested"), ("requested", "provisioning"),
                                                       ("provisioning", "running"), ("running", "draining"),
                                                       ("draining", state)))]
            with store.engine.begin() as conn:
                conn.execute(insert(LeaseRecord.__table__), leases)
                conn.execute(insert(LeaseEventRecord.__table__), events)
    finally:
        store.close()
