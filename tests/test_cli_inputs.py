"""Careless input through the real command line: every case is exit 2 and one sentence on
stderr naming what was wrong, never a traceback and never a silent accept."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUOTE = ["quote", "--gpu", "H100:8"]


def broker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    full.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=full,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, env, words", [
    (QUOTE + ["--hours", "nan"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "inf"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "1e308"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "100000"], {}, "--hours must be a positive number of at most 87840 (ten years)"),
    (QUOTE + ["--hours", "0"], {}, "--hours must be a positive number of at most 87840 (ten years), got 0.0."),
    (QUOTE + ["--hours", "-1"], {}, "--hours must be a positive number of at most 87840 (ten years), got -1.0."),
    (QUOTE + ["--hours", "1", "--data-in-gb", "1e300"], {}, "--data-in-gb must be a finite number"),
    (QUOTE + ["--hours", "1", "--data-out-gb", "-1"], {}, "--data-out-gb must be a finite number"),
    (QUOTE + ["--hours", "1", "--min-sla", "nan"], {}, "--min-sla must be a finite number"),
    (QUOTE + ["--hours", "1", "--residency", "mars"], {}, "residency 'mars' is neither a geography"),
    (QUOTE + ["--hours", "1", "--regions", "mars-1"], {}, "unknown region 'mars-1'"),
    (QUOTE + ["--hours", "1", "--data-location", "aws:nowhere-1"], {}, "'aws:nowhere-1' is not a region of aws"),
    (QUOTE + ["--hours", "1", "--data-location", "mars"], {}, "must be 'onprem' or PROVIDER:REGION"),
    (QUOTE + ["--hours", "1", "--deadline", "2020-01-01T00:00Z"], {}, "--deadline: deadline is in the past"),
    (QUOTE + ["--hours", "1", "--deadline", "tomorrow"], {}, "--deadline must be an ISO time"),
    (QUOTE + ["--hours", "1", "-o", "yaml"], {}, "--format must be table or json"),
    (["quote", "--gpu", "H100:zero", "--hours", "1"], {}, "--gpu count must be a whole number"),
    (["quote", "--gpu", "H100:99999", "--hours", "1"], {},
     "--gpu: 99,999 GPUs is more than the catalog's largest H100 node (8 GPUs) x 1,024 nodes"),
    (["quote", "--gpu", "H100:99999999999999999999", "--hours", "1"], {}, "--gpu count must be at least 1 and at most 1,000,000"),
    (["advise", "--gpus", str(2 ** 63), "--utilization", "0.5"], {}, "--gpus must be a positive whole number, at most 1,000,000"),
    (["advise", "--gpus", "512", "--utilization", "0.5", "--pue", "nan"], {}, "--pue must be a number from 1 to 10"),
    (["advise", "--gpus", "512", "--utilization", "0.5", "--server-capex", "1e308"], {},
     "--server-capex must be a number from 0 to 1e+08"),
    (["leases", "--server", "nohost:notaport"], {}, "the broker address (--server or $BROKER_SERVER) must be HOST:PORT"),
    (["quote", "--gpu", "H100:8", "--hours", "1", "--server", "nohost:notaport"], {},
     "the broker address (--server or $BROKER_SERVER) must be HOST:PORT"),
    (["launch", "--quote-id", "q-1"], {"BROKER_SERVER": "nohost:notaport"}, "must be HOST:PORT"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TLS_CA": "/nowhere/ca.pem"},
     "BROKER_TLS_CA names /nowhere/ca.pem, which cannot be read"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TOKEN": "s3cr3t\n"}, "BROKER_TOKEN holds a space, a line break"),
    (QUOTE + ["--hours", "1", "--server", "127.0.0.1:1"], {"BROKER_TOKEN": "a b"}, "BROKER_TOKEN holds a space"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TLS_CA": str(ROOT / "README.md")},
     "is not a PEM certificate file"),
    # the option parser's own refusals, in the same one sentence
    (QUOTE + ["--hours", "2h"], {}, "Invalid value for '--hours': '2h' is not a valid float (see `"),
    (["quote"], {}, "Missing option '--gpu' (see `"),
    (["bogus"], {}, "No such command 'bogus' (see `"),
    (["advise", "--gpus", "many"], {}, "Invalid value for '--gpus'"),
    # numbers past what the request can carry: refused before any request is built
    (["launch", "--provider", "aws", "--region", "us-east-1", "--instance-type", "p5.48xlarge", "--count",
      "99999999999999999999"], {}, "Invalid value for '--count': 99999999999999999999 is not in the range 1<=x<=1000000"),
    (["launch", "--quote-id", "q-1", "--offer", str(2 ** 64)], {}, "Invalid value for '--offer'"),
    (["launch", "--provider", "aws", "--region", "us-east-1", "--instance-type", "p5.48xlarge",
      "--max-lifetime-s", str(2 ** 64)], {}, "Invalid value for '--max-lifetime-s'"),
    (["watch", "--after", str(2 ** 64), "--server", "127.0.0.1:1"], {}, "Invalid value for '--after'"),
    (["leases", "--limit", str(2 ** 64), "--server", "127.0.0.1:1"], {}, "--limit must be zero (every lease) or more, at most 10,000,000"),
    (QUOTE + ["--hours", "1", "--deadline", "100000000h"], {}, "--deadline is at most 87840h (ten years) from now"),
    (QUOTE + ["--hours", "1", "--server", ""], {}, "--server is empty; give HOST:PORT, or leave it out"),
    (["advise", "--gpus", "8", "--utilization", "0.5", "--plot", "/nonexistent/dir/x.png"], {},
     "--plot: there is no directory /nonexistent/dir to write x.png in"),
    (["diagnose", "--squeue", str(ROOT / "tests/fixtures/slurm/squeue.json"), "--sinfo",
      str(ROOT / "tests/fixtures/slurm/sinfo.json"), "--now", "nan"], {}, "--now must be epoch seconds from 0"),
    (QUOTE + ["--hours", "1"], {"BROKER_QUOTE__TTL": "5"},
     "BROKER_QUOTE__TTL names quote.ttl, which is not a setting (did you mean BROKER_QUOTE__TTL_S?)"),
    (QUOTE + ["--hours", "1"], {"BROKER_SERVER__TLS_KEY_FILE": "/k.pem"},
     "server.tls_cert_file is required when server.tls_key_file is set"),
])
def test_careless_input_is_one_sentence_and_exit_2(args, env, words):
    r = broker(*args, env=env)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr
    assert r.stdout == ""


def test_version_and_the_short_format_flag():
    r = broker("--version")
    assert r.returncode == 0 and r.stdout.startswith("broker ") and r.stdout.split()[1][0].isdigit()
    r = broker(*QUOTE, "--hours", "1", "--residency", "eu", "-o", "json")
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), r.stderr


@pytest.fixture
def silent_database():
    """A PostgreSQL address that accepts connections and never answers (a hung server, a
    firewall that swallows packets): only a connect timeout ends the wait."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"postgresql+psycopg://broker@127.0.0.1:{srv.getsockname()[1]}/broker"
    stop.set()
    t.join(5)
    for c in held:
        c.close()
    srv.close()


@pytest.mark.parametrize("command", [["db", "current"], ["db", "upgrade"], ["tokens", "list"]])
def test_a_database_that_does_not_answer_is_exit_7_within_the_connect_timeout(silent_database, command):
    """Every command that opens the store gives up after [store] connect_timeout_s and says the
    database is unavailable (exit 7), as for one that refuses; none waits forever."""
    r = broker(*command, "--db", silent_database, env={"BROKER_STORE__CONNECT_TIMEOUT_S": "2"})
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert "cannot open the store at" in r.stderr and "timeout" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_broker_shared_data_is_no_setting():
    """The README says to set BROKER_SHARED_DATA to move the shared data: every command takes it."""
    r = broker(*QUOTE, "--hours", "1", env={"BROKER_SHARED_DATA": "/tmp/elsewhere"})
    assert r.returncode == 0, r.stderr
    from broker import config as cfgmod

    assert cfgmod.load(None, environ={"BROKER_SHARED_DATA": "/tmp/elsewhere"}).owner


def test_hostile_files_are_one_sentence_and_exit_2(tmp_path):
    """A binary file or a 200 kB field given as a trace, a deeply nested JSON given as a
    simulation: each is refused with a sentence naming the file, never a traceback."""
    binary = tmp_path / "trace.csv"
    binary.write_bytes(bytes(range(256)) * 40)
    wide = tmp_path / "wide.csv"
    wide.write_text("job_id,submit_time_s,num_gpus,duration_s\n" + "j" + "x" * 200_000 + ",0,1,3600\n")
    nested = tmp_path / "sweep.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)
    nul = tmp_path / "nul.csv"
    nul.write_text("job_id,submit_time_s,num_gpus,duration_s\nj\x001,0,1,3600\n")
    for args, words in (
        (["simulate", "--trace", str(binary), "--onprem-gpus", "8"], "trace.csv is not UTF-8 text"),
        (["simulate", "--trace", str(wide), "--onprem-gpus", "8"], "wide.csv line 2: a field is longer than"),
        (["simulate", "--trace", str(wide.parent / "ok.csv"), "--onprem-gpus", "8"], "cannot read trace"),
        (["advise", "--simulation", str(nested)], "sweep.json is nested too deeply"),
        (["advise", "--from-simulate", str(nested)], "sweep.json is nested too deeply"),
        (["advise", "--simulation", str(binary)], "trace.csv is not JSON"),
    ):
        r = broker(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-500:])
        assert words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-500:])
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr[-500:]
    (tmp_path / "lifetimes.csv").write_bytes(bytes(range(256)) * 40)
    r = broker("simulate", "--trace", str(nul), "--onprem-gpus", "8", "--spot-lifetimes",
               str(tmp_path / "lifetimes.csv"), "--gpu-model", "H100")
    assert r.returncode == 2 and "lifetimes.csv is not UTF-8 text" in r.stderr, r.stderr[-500:]


def _certificate(tmp_path, name: str, days: float, start_days: float = -1):
    """A self-signed certificate valid from ``start_days`` to ``days`` from now, and its key."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now + dt.timedelta(days=start_days))
            .not_valid_after(now + dt.timedelta(days=days)).sign(key, hashes.SHA256()))
    (tmp_path / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    return tmp_path / f"{name}.crt", tmp_path / f"{name}.key"


@pytest.mark.parametrize("case, words", [
    ("mismatch", "config: server.tls_key_file {other_key} is not the key of the certificate in "
                 "server.tls_cert_file {cert}"),
    ("expired", "config: server.tls_cert_file {expired} expired on "),
    ("future", "config: server.tls_cert_file {future} is not valid before "),
    ("swapped", "config: server.tls_key_file {cert} holds no private key (a PEM file of another kind"),
    ("key as CA", "config: server.tls_client_ca_file {key} holds no certificate"),
])
def test_a_tls_key_that_does_not_match_or_an_expired_certificate_is_named_at_start_up(tmp_path, case, words):
    """Not gRPC's "Failed to bind to address": the file and the cause, exit 2. An expired
    certificate is refused (every client's handshake would fail against it)."""
    cert, _key = _certificate(tmp_path, "good", days=30)
    _, other_key = _certificate(tmp_path, "other", days=30)
    expired, expired_key = _certificate(tmp_path, "expired", days=-1, start_days=-30)
    future, future_key = _certificate(tmp_path, "future", days=60, start_days=30)
    pair = {"mismatch": (cert, other_key), "expired": (expired, expired_key), "future": (future, future_key),
            "swapped": (_key, cert), "key as CA": (cert, _key)}[case]
    ca = {"BROKER_SERVER__TLS_CLIENT_CA_FILE": str(_key)} if case == "key as CA" else {}
    r = broker("serve", "--listen", "127.0.0.1:0", "--db", f"sqlite:///{tmp_path / 'b.db'}", "--log-level", "error",
               env={"BROKER_SERVER__TLS_CERT_FILE": str(pair[0]), "BROKER_SERVER__TLS_KEY_FILE": str(pair[1]), **ca})
    assert r.returncode == 2, (r.returncode, r.stderr[-1000:])
    said = [line for line in r.stderr.strip().splitlines() if not line.startswith("{")]
    expected = words.format(other_key=other_key, cert=cert, expired=expired, future=future, key=_key)
    assert len(said) == 1 and expected in said[0] and "Traceback" not in r.stderr, said


def _bounded_memory() -> None:  # a regression reads /dev/zero into MemoryError, not the machine
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 * 1024 ** 3, 6 * 1024 ** 3))


@pytest.mark.parametrize("args, env, words", [
    (["simulate", "--trace", "/dev/zero", "--onprem-gpus", "8"], {},
     "zero: line 1 is longer than 1,048,576 characters"),
    (["simulate", "--trace", "TRACE", "--onprem-gpus", "8", "--gpu-model", "H100", "--spot-lifetimes", "/dev/zero"],
     {}, "zero: line 1 is longer than 1,048,576 characters"),
    (["diagnose", "--snapshot", "/dev/zero"], {}, "cannot read the snapshot file /dev/zero: it is larger than 256 MiB"),
    (["diagnose", "--squeue", "/dev/zero", "--sinfo", "/dev/null"], {}, "cannot read the squeue file /dev/zero"),
    (["advise", "--simulation", "/dev/zero"], {}, "cannot read /dev/zero: it is larger than 256 MiB"),
    (["advise", "--from-simulate", "/dev/zero"], {}, "cannot read /dev/zero: it is larger than 256 MiB"),
    (["advise", "--sacct", "/dev/zero", "--gpus", "8"], {}, "cannot read /dev/zero: it is larger than 256 MiB"),
    (QUOTE + ["--hours", "1", "--config", "/dev/zero"], {}, "config file /dev/zero cannot be read: it is larger than 16 MiB"),
    (["serve", "--config", "/dev/zero"], {}, "config file /dev/zero cannot be read: it is larger than 16 MiB"),
    (["leases", "--server", "127.0.0.1:1"], {"BROKER_TLS_CA": "/dev/zero"},
     "BROKER_TLS_CA names /dev/zero, which cannot be read (it is larger than 16 MiB"),
    (["serve", "--db", "sqlite:///DIR/b.db"], {"BROKER_SERVER__TLS_CERT_FILE": "/dev/zero",
                                               "BROKER_SERVER__TLS_KEY_FILE": "/dev/zero"},
     "server.tls_key_file /dev/zero cannot be read: it is not a regular file"),
    (QUOTE + ["--hours", "1"], {"BROKER_CATALOG__PATH": "DIR/prices"},
     "prices/prices.csv cannot be read: line 1 is longer than 1,048,576 characters"),
    (QUOTE + ["--hours", "1"], {"BROKER_CATALOG__PATH": "DIR/network"},
     "network/network.toml cannot be read: it is larger than 16 MiB"),
])
def test_a_file_that_never_ends_is_one_sentence_and_exit_2(tmp_path, args, env, words):
    """A path typed by mistake that names an endless file: each read is bounded (a document
    by its size, a table by its line length), so the refusal comes at once, in bounded memory."""
    trace = tmp_path / "trace.csv"
    trace.write_text("job_id,submit_time_s,num_gpus,duration_s\nj1,0,1,3600\n")
    for endless in ("prices.csv", "network.toml"):  # a catalog with one endless file
        d = tmp_path / endless.split(".")[0]
        shutil.copytree(ROOT / "providers" / "data", d)
        (d / endless).unlink()
        (d / endless).symlink_to("/dev/zero")
    args = [str(trace) if a == "TRACE" else a.replace("DIR", str(tmp_path)) for a in args]
    full = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    full.update({"PYTHONPATH": str(ROOT), **{k: v.replace("DIR", str(tmp_path)) for k, v in env.items()}})
    r = subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, env=full,
                       timeout=120, stdin=subprocess.DEVNULL, preexec_fn=_bounded_memory)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert words in r.stderr and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr[-500:]


def test_json_on_a_first_use_is_only_json(tmp_path):
    """The store made on a command's first use logs its schema upgrade: to stderr, so stdout
    stays the command's JSON."""
    import json

    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)}
    r = broker("catalog", "refresh", "--provider", "aws", "-o", "json", env=env)
    assert r.returncode == 2 and r.stdout == "" and "schema_upgraded" in r.stderr, (r.stdout, r.stderr)
    r = broker("tokens", "list", "-o", "json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout) == [], (r.stdout, r.stderr)


def test_a_slurm_program_run_by_hand_says_why_it_failed(tmp_path):
    """slurmctld discards what its programs print (the log file has it), but a person running
    one at a terminal gets one sentence and the error table's code: a bad address 2, no broker
    answering 7 (both were exit 1 and silence)."""
    log = str(tmp_path / "slurm.log")
    r = broker("slurm", "resume", "burst-1", "--server", "nohost:notaport", "--log", log)
    assert r.returncode == 2 and "must be HOST:PORT" in r.stderr, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("broker: "), r.stderr
    r = broker("slurm", "suspend", "burst-1", "--server", "127.0.0.1:1", "--log", log)
    assert r.returncode == 7 and "no broker answering at 127.0.0.1:1" in r.stderr, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "resume_crashed" in open(log).read() and "suspend_crashed" in open(log).read()
