"""Placements: one class per way the Spark application runs, chosen once per task.

=====================  ============  ======================================================
master                 deploy mode   placement
=====================  ============  ======================================================
``local[...]``         client        ClientMode: the driver in the task, on this worker
``spark://``           client        ClientMode
``spark://``           cluster       StandaloneCluster: the driver on a worker; follow, defer, re-attach
``yarn``               client        ClientMode
``yarn``               cluster       YarnCluster: the driver is the application master
``k8s://``             client        KubernetesClientMode
``k8s://``             cluster       KubernetesCluster: the driver in a pod
=====================  ============  ======================================================

Everything here runs in the Airflow task (the worker); the trigger that a deferring placement hands
the task to runs in the triggerer (triggers/).
"""

from __future__ import annotations

from airflow_provider_hvd.hooks.spark_submit import HorovodSparkSubmitHook
from airflow_provider_hvd.placements.base import ConnectionSettings, Placement
from airflow_provider_hvd.placements.client import ClientMode, KubernetesClientMode
from airflow_provider_hvd.placements.kubernetes import KubernetesCluster
from airflow_provider_hvd.placements.standalone import StandaloneCluster
from airflow_provider_hvd.placements.yarn import YarnCluster

DEPLOY_MODES = ("client", "cluster")
MASTERS = (("local", "local"), ("spark://", "standalone"), ("yarn", "yarn"), ("k8s://", "kubernetes"))
PLACEMENTS: dict[tuple[str, str], type[Placement]] = {
    ("local", "client"): ClientMode,
    ("standalone", "client"): ClientMode,
    ("standalone", "cluster"): StandaloneCluster,
    ("yarn", "client"): ClientMode,
    ("yarn", "cluster"): YarnCluster,
    ("kubernetes", "client"): KubernetesClientMode,
    ("kubernetes", "cluster"): KubernetesCluster,
}

__all__ = ["DEPLOY_MODES", "ConnectionSettings", "Placement", "check_deploy_mode", "choose", "placement_class"]


def check_deploy_mode(deploy_mode: str | None) -> None:
    """None (the connection's, else client) or one of DEPLOY_MODES."""
    if deploy_mode is not None and deploy_mode not in DEPLOY_MODES:
        raise ValueError(f"deploy_mode {deploy_mode!r} is not one of {', '.join(DEPLOY_MODES)}")


def cluster_kind(master: str) -> str:
    for prefix, kind in MASTERS:
        if master.startswith(prefix):
            return kind
    raise ValueError(f"Spark master {master!r} is not one HorovodRunnerOperator submits to: use local[...], "
                     "spark://host:port, yarn or k8s://https://<api-server>")


def placement_class(master: str, deploy_mode: str | None) -> type[Placement]:
    """The placement for ``master`` and ``deploy_mode`` (None: client), or a ValueError saying what to use."""
    check_deploy_mode(deploy_mode)
    kind, mode = cluster_kind(master), deploy_mode or "client"
    if (kind, mode) not in PLACEMENTS:
        raise ValueError(f"deploy_mode '{mode}' needs a cluster, and the Spark master is {master!r}: use "
                         "deploy_mode 'client' (the default) for local Spark")
    return PLACEMENTS[(kind, mode)]


def choose(hook: HorovodSparkSubmitHook, settings: ConnectionSettings) -> Placement:
    """The placement for the Spark connection the hook resolved (its master and deploy mode)."""
    return placement_class(hook.master, hook.deploy_mode)(hook, settings)
