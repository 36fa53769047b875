"""What a Compute Engine node does at boot on its own (:class:`providers.registration.BootHooks`):
it learns its name from the metadata server's instance name, and watches ``instance/preempted``,
which turns TRUE when the ~30 s soft-off of a preemption starts."""
from __future__ import annotations

from providers.registration import BootHooks

BOOT = BootHooks(
    whoami=('BROKER_NODE_NAME=$(curl -sf -H "Metadata-Flavor: Google" '
            'http://metadata.google.internal/computeMetadata/v1/instance/name)'),
    metadata_url="http://metadata.google.internal",
    notice_watch=r"""broker_watch_notices() {
    local v
    while :; do
        v=$(curl -sf -H 'Metadata-Flavor: Google' "$notice_md/computeMetadata/v1/instance/preempted") \
            || { sleep 2; continue; }
        if [ "$v" = TRUE ]; then broker_notice preemption "gcp: metadata instance/preempted"; return; fi
        curl -sf -o /dev/null -H 'Metadata-Flavor: Google' \
            "$notice_md/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=60" || sleep 1
    done
}""",
)
