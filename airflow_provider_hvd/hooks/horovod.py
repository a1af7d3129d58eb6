"""HorovodHook: the ``horovod`` connection (storage, signing key, runner defaults); ``load_result``."""

from __future__ import annotations

import secrets
from typing import Any

from airflow.sdk import ObjectStoragePath

from airflow_provider_hvd.get_provider_info import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_hvd.runner.errors import PayloadError
from airflow_provider_hvd.version_compat import AirflowNotFoundException, BaseHook, mask_secret

DEFAULT_STORAGE = "file:///tmp/airflow-provider-hvd"


class HorovodHook(BaseHook):
    """Settings shared by every Horovod task of a deployment, from a ``horovod`` connection.

    Connection fields: *Host* unused; *Password*: the signing key (hex, 32 bytes or
    more; when empty a fresh key is made for each run); *Extra* (JSON):
    ``storage_path`` (any ObjectStoragePath URL), ``kubernetes_secret`` (``<name>:<key>``, the
    Kubernetes Secret holding the signing key, for cluster mode on Kubernetes), and every
    HorovodRunner option (``launcher``, ``driver_log_verbosity``, ``max_restarts``, ...). A
    missing connection means defaults: per-run keys and the operator's own ``storage_path``.

    :param horovod_conn_id: the connection id (default ``horovod_default``).
    """

    conn_name_attr = "horovod_conn_id"
    default_conn_name = "horovod_default"
    conn_type = "horovod"
    hook_name = "Horovod"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """For Airflow before 3.2, which asks the hook; later ones read provider info (one definition)."""
        return {key.replace("-", "_"): value for key, value in UI_FIELD_BEHAVIOUR.items()}

    def __init__(self, horovod_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.horovod_conn_id = horovod_conn_id
        self._settings: dict[str, Any] | None = None

    def get_conn(self) -> dict[str, Any]:
        """The connection's settings: ``signing_key`` (hex or None) and the extra fields."""
        if self._settings is None:
            try:
                conn = self.get_connection(self.horovod_conn_id)
            except AirflowNotFoundException:
                self._settings = {"signing_key": None}
            else:
                self._settings = {**conn.extra_dejson, "signing_key": conn.password or None}
        return self._settings

    def signing_key(self) -> bytes:
        """The connection's key, or a fresh per-run key. Registered with Airflow's secrets masker, so
        a log line that happens to carry it (a library echoing its environment) shows ``***``."""
        key = self._signing_key()
        mask_secret(key.hex())
        return key

    def _signing_key(self) -> bytes:
        key_hex = self.get_conn().get("signing_key")
        if not key_hex:
            return secrets.token_bytes(32)
        try:
            key = bytes.fromhex(key_hex.strip())
        except ValueError:
            raise ValueError(f"the signing key of connection {self.horovod_conn_id!r} is not hex; generate one "
                             "with: python -c 'import secrets; print(secrets.token_hex(32))'") from None
        if len(key) < 16:
            raise ValueError(f"the signing key of connection {self.horovod_conn_id!r} has {len(key)} bytes; "
                             "use at least 16 (32 recommended)")
        return key

    def has_signing_key(self) -> bool:
        """Whether results can be verified after the run: only with the connection's key."""
        return bool(self.get_conn().get("signing_key"))

    def load_result(self, uri: str) -> Any:
        """Rank 0's value from the result file a HorovodRunnerOperator left at ``uri`` (its return
        value when the value was not JSON), after checking its signature with the connection's key."""
        from airflow_provider_hvd.runner.results import open_result

        if not self.has_signing_key():
            raise ValueError(f"connection {self.horovod_conn_id!r} has no signing key, so no result can be verified "
                             "after its run (each run signed with a key of its own). Set one as the connection's "
                             "password (python -c 'import secrets; print(secrets.token_hex(32))') and run the "
                             "training again.")
        try:
            sealed = ObjectStoragePath(uri).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"no result at {uri}: pass the training task's return value (its XCom "
                                    "return_value) as it is") from None
        try:
            return open_result(sealed, self.signing_key())
        except PayloadError as exc:
            raise PayloadError(f"refused the result at {uri}: {exc}") from None

    def storage_path(self, override: str | None = None) -> ObjectStoragePath:
        return ObjectStoragePath(override or self.setting("storage_path", None) or DEFAULT_STORAGE)

    def setting(self, name: str, default: Any) -> Any:
        """An extra field of the connection, as the UI form (``extra__horovod__<name>``) or a JSON
        extra (``<name>``) sets it; ``default`` when unset or empty."""
        if name not in CONN_FIELDS:
            raise KeyError(f"{name!r} is not a field of the horovod connection ({', '.join(CONN_FIELDS)}): declare "
                           "it in get_provider_info.CONN_FIELDS so that Airflow's UI shows it")
        settings = self.get_conn()
        value = settings.get(name)
        if value in (None, ""):
            value = settings.get(f"extra__{self.conn_type}__{name}")
        return default if value in (None, "") else value


def load_result(uri: str, horovod_conn_id: str = HorovodHook.default_conn_name) -> Any:
    """Rank 0's value that a HorovodRunnerOperator left in storage (``uri``: that task's return
    value when the value was not JSON), verified with the ``horovod`` connection's signing key::

        @task
        def evaluate(result_uri: str):
            state = load_result(result_uri)

        evaluate(train.output)
    """
    return HorovodHook(horovod_conn_id=horovod_conn_id).load_result(uri)
