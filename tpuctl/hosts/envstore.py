"""A run's environment in its bucket: built once, stored as a tar, restored on every host with the stdlib.

One host (the builder) makes the environment as ``tpuctl.hosts.setup`` does, packs it with the image's
``tar`` and stores it under ``gs://<bucket>/tpuctl/envs/<key>/`` (an archive, then the record naming
it), the key hashing every input (``SetupSpec.key``), so a later run with the same inputs in the same
bucket builds nothing. Every other
host, and every host of a recovery, restores it from there: no pip, no uv, no package index, only the
image's ``python3`` (its standard library speaks Cloud Storage's JSON API with the token of the host's
metadata server) and ``tar``. Hosts without external IPs reach the bucket through Private Google Access,
so they set up too; the package index is asked once per environment, by the builder.

The download streams into ``tar -x`` (a process of its own, so writing files overlaps reading the
network): no intermediate file, the archive uncompressed (a restore is bound by the disk, not the CPU).
The builder packs twice from the page cache, once to count the bytes (the JSON API's single-request
upload wants the length first) and once into the request, rather than writing a copy to its disk.
"""

from __future__ import annotations

import hashlib
import shlex

#: The exit status of a restore whose archive is not in the bucket (anything else non-zero: a failure).
ENV_MISSING = 10

#: The host tool, run with the image's ``python3``, on ``PREFIX`` = ``env_prefix(key)``:
#:
#: - ``restore BUCKET PREFIX DIR``: reads the record ``PREFIX/stored.json`` (exit ``ENV_MISSING`` when
#:   there is none), streams the archive it names into ``tar -x -C DIR`` and fails unless it had the
#:   record's byte count.
#: - ``store BUCKET PREFIX DIR``: unless the record exists, uploads DIR's tar under a name of its own
#:   (``PREFIX/env-<random>.tar``), then the record naming it, ``ifGenerationMatch=0`` (the first
#:   builder's record stands; a second one's archive is left unnamed).
#:
#: The record is written only after its archive was stored whole, so a builder cut off mid-upload (a
#: preemption) leaves no record, and the next run's builder stores the environment again instead of
#: every host restoring half an archive. The endpoint is storage.googleapis.com unless
#: ``API_ENDPOINT_OVERRIDE`` (google-cloud-storage's own override) names another; the token is the VM's
#: service account's, from its metadata server (``GCE_METADATA_HOST`` where the name
#: metadata.google.internal does not resolve).
GCS_TOOL = r'''"""tpuctl: the run's environment to and from Cloud Storage, with the standard library only."""
import fcntl, http.client, json, os, subprocess, sys, urllib.parse, uuid

MISSING = 10
CHUNK = 1 << 20
RECORD = "stored.json"


def connect(url):
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.netloc, timeout=300, blocksize=CHUNK), parts.path.rstrip("/")


def token():
    conn, _ = connect("http://" + (os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"))
    path = "/computeMetadata/v1/instance/service-accounts/default/token"
    conn.request("GET", path, headers={"Metadata-Flavor": "Google"})
    answer = conn.getresponse()
    body = answer.read()
    if answer.status != 200:
        sys.exit(f"the metadata server gave no token ({answer.status}): {body[:300]!r}")
    return json.loads(body)["access_token"]


def request(method, path, **kwargs):
    conn, prefix = connect(os.environ.get("API_ENDPOINT_OVERRIDE") or "https://storage.googleapis.com")
    headers = {"Authorization": "Bearer " + token(), **kwargs.pop("headers", {})}
    conn.request(method, prefix + path, headers=headers, **kwargs)
    return conn.getresponse()


def quote(text):
    return urllib.parse.quote(text, safe="")


def download(bucket, name):
    """The object's answer (200), or None when there is no such object."""
    answer = request("GET", f"/download/storage/v1/b/{quote(bucket)}/o/{quote(name)}?alt=media")
    if answer.status == 404:
        answer.read()
        return None
    if answer.status != 200:
        sys.exit(f"reading gs://{bucket}/{name} failed ({answer.status}): {answer.read()[:300]!r}")
    return answer


def upload(bucket, name, body, size, content_type, **query):
    query = urllib.parse.urlencode({"uploadType": "media", "name": name, **query})
    headers = {"Content-Type": content_type, "Content-Length": str(size)}
    answer = request("POST", f"/upload/storage/v1/b/{quote(bucket)}/o?{query}", body=body, headers=headers)
    text = answer.read()
    if answer.status not in (200, 412):
        sys.exit(f"storing gs://{bucket}/{name} failed ({answer.status}): {text[:300]!r}")
    return answer.status


def restore(bucket, prefix, directory):
    answer = download(bucket, f"{prefix}/{RECORD}")
    if answer is None:
        sys.exit(MISSING)
    record = json.loads(answer.read())
    answer = download(bucket, record["archive"])
    if answer is None:
        sys.exit(f"gs://{bucket}/{record['archive']}, which gs://{bucket}/{prefix}/{RECORD} names, is gone")
    tar = subprocess.Popen(["tar", "-x", "-f", "-", "-C", directory], stdin=subprocess.PIPE)
    try:  # a larger pipe: fewer switches between this process and tar
        fcntl.fcntl(tar.stdin.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), CHUNK)
    except OSError:
        pass
    got, buffer = 0, bytearray(CHUNK)
    try:
        while read := answer.readinto(buffer):
            got += read
            tar.stdin.write(memoryview(buffer)[:read])
    finally:
        tar.stdin.close()
    if tar.wait() != 0 or got != record["bytes"]:
        where = f"gs://{bucket}/{record['archive']}"
        sys.exit(f"{where}: {got} of {record['bytes']} bytes, tar exit {tar.returncode}")


def packed(directory):
    """tar's archive of DIRECTORY, as it makes it."""
    return subprocess.Popen(["tar", "-c", "-f", "-", "-C", directory, "."], stdout=subprocess.PIPE)


def chunks(tar, size):
    """tar's output in chunks; raises unless it is SIZE bytes and tar succeeded (never a short upload)."""
    sent = 0
    while chunk := tar.stdout.read(CHUNK):
        sent += len(chunk)
        yield chunk
    if tar.wait() != 0 or sent != size:
        raise SystemExit(f"tar failed or changed its archive (exit {tar.returncode}, {sent} of {size} bytes)")


def store(bucket, prefix, directory):
    if download(bucket, f"{prefix}/{RECORD}") is not None:
        print(f"gs://{bucket}/{prefix} was stored already")
        return
    # The archive twice, from the page cache: once to count it (the single-request upload wants its
    # length first), once into the request. No copy of it is written to the disk.
    counting, size, buffer = packed(directory), 0, bytearray(CHUNK)
    while read := counting.stdout.readinto(buffer):
        size += read
    if counting.wait() != 0:
        sys.exit(f"tar could not pack {directory} (exit {counting.returncode})")
    archive = f"{prefix}/env-{uuid.uuid4().hex}.tar"
    upload(bucket, archive, chunks(packed(directory), size), size, "application/x-tar")
    record = json.dumps({"archive": archive, "bytes": size}).encode()
    name = f"{prefix}/{RECORD}"
    # Not application/json: the simulator's storage emulator parses such a body as API metadata.
    if upload(bucket, name, record, len(record), "application/octet-stream", ifGenerationMatch="0") == 412:
        print(f"gs://{bucket}/{prefix} was stored already (by another builder)")


if __name__ == "__main__":
    {"restore": restore, "store": store}[sys.argv[1]](*sys.argv[2:])
'''


def env_prefix(key: str) -> str:
    """Where the environment with this key is kept, in any bucket (content-addressed: the key hashes
    every input): its record ``stored.json`` and the archive that names."""
    return f"tpuctl/envs/{key}"


def env_record(key: str) -> str:
    """The object that says the environment is stored, and which archive holds it."""
    return f"{env_prefix(key)}/stored.json"


def env_url(bucket: str, key: str) -> str:
    """``gs://<bucket>/<prefix>/`` of the environment with this key (for messages)."""
    return f"gs://{bucket}/{env_prefix(key)}/"


def tool_path(remote_root: str) -> str:
    """The host path of ``GCS_TOOL`` (relative paths: to the login home), named by its content's hash,
    so a host keeps no stale copy across tpuctl versions."""
    digest = hashlib.sha256(GCS_TOOL.encode()).hexdigest()[:12]
    return f"{remote_root.rstrip('/')}/tools/tpuctl-gcs-{digest}.py"


def tool_steps(remote_root: str) -> str:
    """Shell lines (for a script that has set ``$root``) that write ``GCS_TOOL`` where ``tool_path``
    says unless it is there, and set ``$gcs`` to it."""
    relative = tool_path(remote_root)[len(remote_root.rstrip("/")) :]
    return (
        f'gcs="$root{relative}"\n'
        'if [ ! -f "$gcs" ]; then\n'
        '  mkdir -p "${gcs%/*}"\n'
        "  cat > \"$gcs.tmp-$$\" <<'TPUCTL_GCS_TOOL'\n"
        f"{GCS_TOOL}"
        "TPUCTL_GCS_TOOL\n"
        '  mv "$gcs.tmp-$$" "$gcs"\n'
        "fi\n"
    )


def store_steps(bucket: str, key: str) -> str:
    """Shell lines (after ``tool_steps``, with ``$env`` built and the script's ``step`` function) that
    pack ``$env`` and store it in the bucket, unless an earlier run stored it first."""
    return f'step python3 "$gcs" store {shlex.quote(bucket)} {shlex.quote(env_prefix(key))} "$env"\n'


def is_store_step(command: str) -> bool:
    """Whether ``command`` (a step's line, as ``failed_command`` gives it) is the builder's storing step:
    a failure there is the bucket's, not the build's."""
    return "/tpuctl-gcs-" in command and " store " in command


def restore_steps(bucket: str, key: str, prefix: str) -> str:
    """Shell lines (after ``tool_steps``, ``$env`` not there) that restore ``$env`` from the bucket into a
    fresh directory renamed into place last (a host cut off halfway keeps no half environment); on an
    archive the bucket does not have, print ``<prefix> not in the bucket: ...`` and exit ``ENV_MISSING``.
    """
    url = env_url(bucket, key)
    return (
        'part="$env.part-$$"\n'
        'rm -rf "$env" "$part" && mkdir -p "$part"\n'
        f"printf '%s\\n' {shlex.quote(f'{prefix} $ restore {url}')}\n"
        f'python3 "$gcs" restore {shlex.quote(bucket)} {shlex.quote(env_prefix(key))} "$part" '
        '|| { s=$?; rm -rf "$part"; '
        f"if [ $s -eq {ENV_MISSING} ]; then echo {shlex.quote(f'{prefix} not in the bucket: {url}')}; fi; "
        "exit $s; }\n"
        'mv "$part" "$env"\n'
    )
