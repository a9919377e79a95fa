"""A remote region's own Kafka cluster: an embedded broker ``astraflow launch`` starts, or an
existing cluster the topology names by its bootstrap servers, and the MirrorMaker 2 that copies
the job's ``weights.<policy>`` and ``versions`` into it from home (under ``astraflow launch``,
and under ``astraflow mirror`` on a multi-host deployment: :mod:`.mirror_run`).

The topic flow is docs/cross_region_mirror.md's option (a): every topic lives on the home
cluster; only the weight topics are mirrored, one way, so a version's bytes cross the region's
link once however many of its nodes read them. With an emulated link (:mod:`.links`) the broker
and MirrorMaker run inside the region's network namespace, like its nodes:

* the broker's ``PLAINTEXT`` listener is on the namespace's loopback: the region's nodes and
  MirrorMaker dial it there (:attr:`RegionalCluster.local`);
* a ``HOME`` listener on the region's address is advertised at a path home dials across the
  link (:meth:`~.links.RegionLink.expose`): the launcher creates the mirrored topics and
  measures the mirror's lag through it (:attr:`RegionalCluster.here`);
* MirrorMaker consumes from home through the home broker's listener for this link (the same
  one the region's nodes use) and produces locally: Kafka's recommended placement.

Without a link (``emulate_links: false``, an external home cluster) the broker and MirrorMaker
run as plain processes of this machine. An existing regional cluster starts nothing but
MirrorMaker, and is never behind an emulated link (emulation needs a broker launch starts). This
module knows Kafka processes and addresses; no job config beyond the topics, no nodes.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from astraflow.topics import JobTopics
from astraflow.topics.broker import EmbeddedBroker, free_port
from astraflow.topics.mirror import MirrorMaker
from astraflow.topics.mirror_plan import MirrorPlan
from astraflow.topics.security import ClientSecurity

from .links import RegionLink

#: The JVM heaps of a region's broker and of its MirrorMaker: they hold a few versions in flight.
BROKER_HEAP, MIRROR_HEAP = "512m", "384m"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


#: MirrorMaker's alias of the home cluster in every flow (its Connect group is ``home-mm2``)
HOME_ALIAS = "home"


def alias(region: str) -> str:
    """A MirrorMaker cluster alias for a region (letters, digits and '_')."""
    return "region_" + re.sub(r"\W", "_", region)


def _broker_count(bootstrap: str, security_setting=None) -> int:
    from astraflow.topics import security
    admin = security.admin(bootstrap_servers=bootstrap, client_id="astraflow-region", security=security_setting)
    try:
        return max(1, len(admin.describe_cluster().get("brokers", [])))
    finally:
        admin.close()


def job_mirror_plan(region: str, topics: JobTopics, home: str, target: str, snapshot_bytes: int,
                    replication_factor: int = 1, home_security: ClientSecurity | None = None,
                    target_security: ClientSecurity | None = None) -> MirrorPlan:
    """The flow of region ``region``: the job's weight topics from ``home`` into ``target``
    (both as MirrorMaker reaches them, with the client settings there: None, the process's),
    the mirrored topics with their own bound."""
    return MirrorPlan.for_job(topics, source=(HOME_ALIAS, home), target=(alias(region), target),
                              snapshot_bytes=snapshot_bytes, replication_factor=replication_factor,
                              source_security=home_security, target_security=target_security)


class RegionalCluster:
    """Region ``region``'s own cluster, embedded (in its namespace when ``link`` is given) or,
    with ``bootstrap``, an existing one (``security``: how clients authenticate to it; None: the
    process's setting); once :meth:`mirror_from` ran, its MirrorMaker 2 from home."""

    def __init__(self, region: str, work_dir: Path, link: RegionLink | None = None,
                 bootstrap: str | None = None, security: ClientSecurity | None = None) -> None:
        self.region, self.link, self.work_dir = region, link, Path(work_dir)
        self.security = security
        self.mirror: MirrorMaker | None = None
        self.broker: EmbeddedBroker | None = None
        if bootstrap is not None:  # an existing cluster: nothing to start, one address for everyone
            if link is not None:
                raise ValueError(f"region {region}: an existing cluster ({bootstrap}) cannot sit behind an emulated "
                                 f"link (emulation needs a broker `astraflow launch` starts)")
            self.local = self.here = bootstrap
            return
        if link is None:
            self.broker = EmbeddedBroker(self.work_dir / "kafka", heap=BROKER_HEAP)
            self.local = self.here = self.broker.bootstrap_servers
            return
        port, controller, home_port = free_port(), free_port(), free_port()  # (the namespace has no others)
        fwd = link.expose(home_port, name="kafka")
        props = {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},"
                         f"HOME://{link.region_ip}:{home_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},"
                                    f"HOME://{fwd.address}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,HOME:PLAINTEXT",
        }
        self.broker = EmbeddedBroker(self.work_dir / "kafka", port=port, controller_port=controller,
                                     heap=BROKER_HEAP, properties=props, wrap=link.wrap,
                                     probe=lambda: link.in_region(lambda: _listening(port)))
        self.local = f"127.0.0.1:{port}"  #: what the region's processes dial (inside its namespace)
        self.here = fwd.address  #: what this process (home) dials, across the link

    @property
    def existing(self) -> bool:
        """An existing cluster named by its bootstrap servers (nothing of it is started here)."""
        return self.broker is None

    def start(self) -> "RegionalCluster":
        if self.broker is not None:
            self.broker.start()
        return self

    def exit_code(self) -> int | None:
        """The embedded broker's exit code once it died; None while it runs (or for an existing cluster)."""
        return self.broker.exit_code() if self.broker is not None else None

    def mirror_from(self, topics: JobTopics, home_here: str, home_there: str, snapshot_bytes: int,
                    wait: bool = True, home_security: ClientSecurity | None = None) -> MirrorMaker:
        """Start MirrorMaker 2 mirroring ``topics``' weight topics from home into this cluster.

        ``home_here``: the home cluster as this process reaches it; ``home_there``: as the region
        does (the home broker's listener for the region's link); ``home_security``: how clients
        authenticate there (None: the process's setting)."""
        # MirrorMaker's internal topics: as many copies as an existing cluster affords (at most 3)
        rf = 1 if self.broker is not None else min(3, _broker_count(self.here, self.security))
        plan = job_mirror_plan(self.region, topics, home_there, self.local, snapshot_bytes, rf,
                               home_security=home_security, target_security=self.security)
        self.mirror = MirrorMaker(plan, self.work_dir / "mirror", heap=MIRROR_HEAP, startup_timeout=240,
                                  wrap=self.link.wrap if self.link is not None else None,
                                  reach=(home_here, self.here))
        self.mirror.start(wait=wait)
        return self.mirror

    def describe(self) -> dict:
        """What the summary records of this cluster: where it is and how far its mirror is behind."""
        out: dict = {"region": self.region, "bootstrap_in_region": self.local, "bootstrap_from_home": self.here,
                     "in_namespace": self.link is not None, "existing": self.existing,
                     "security": self.security.describe() if self.security is not None else None,
                     "log": str(self.broker.log_path) if self.broker is not None else None}
        if self.mirror is not None:
            out["mirror"] = {"flow": self.mirror.plan.flow, "topics": list(self.mirror.plan.topics),
                             "starts": self.mirror.starts, "log": str(self.mirror.log_path)}
            try:
                lags = self.mirror.lag()
                out["mirror"]["lag_records"] = {f"{tp.topic}[{tp.partition}]": pl.lag for tp, pl in lags.items()}
                out["mirror"]["mirrored_records"] = sum(pl.mirrored for pl in lags.values())
            except Exception as e:  # noqa: BLE001 - a summary says what it could not measure
                out["mirror"]["lag_error"] = f"{type(e).__name__}: {e}"
        return out

    def stop_mirror(self) -> None:
        if self.mirror is not None:
            self.mirror.stop()

    def close(self) -> None:
        self.stop_mirror()
        if self.broker is not None:
            self.broker.stop()
