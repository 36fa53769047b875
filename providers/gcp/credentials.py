"""``[providers.gcp] credentials``: which Google credentials the Compute clients use."""
from __future__ import annotations

import json
from typing import Any

from google.auth import exceptions as auth_exc

from providers.files import SMALL_BYTES, read_bytes
from providers.gcp.settings import GcpSettings

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


def load_credentials(settings: GcpSettings) -> Any:
    """``anonymous`` (loopback emulators only), a service-account key file, or ADC."""
    from google.auth import default as adc
    from google.auth.credentials import AnonymousCredentials
    from google.oauth2 import service_account

    how = settings.credentials
    if how == "anonymous":
        return AnonymousCredentials()
    if how in ("", "default", "adc"):
        try:
            creds, _project = adc(scopes=list(SCOPES))
        except auth_exc.DefaultCredentialsError as e:
            raise ValueError(f"providers.gcp.credentials: no Application Default Credentials found ({e})") from None
        return creds
    try:  # read within a bound, a regular file only (a FIFO would block start-up for ever)
        info = json.loads(read_bytes(how, SMALL_BYTES, regular=True))
        return service_account.Credentials.from_service_account_info(info, scopes=list(SCOPES))
    except OSError as e:
        raise ValueError(f"providers.gcp.credentials: cannot read service-account key file {how!r} "
                         f"({e.strerror or type(e).__name__})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"providers.gcp.credentials: cannot read service-account key file {how!r} "
                          f"({type(e).__name__})") from None
