"""Weight transfer over Kafka: the trainer's publisher and the RaaS nodes' subscriber.

The two ends share nothing but ``weights.<policy>`` (chunked snapshots and sparse deltas)
and the compacted ``versions`` topic (one announcement per version, latest per policy).
The protocol and the retention rule are described in :mod:`.weight_publisher`; how a
node reaches a version (delta path, snapshot path, verification) in :mod:`.weight_subscriber`.
"""

from .weight_publisher import PublishedVersion, WeightPublisher, WeightPublishError, read_latest_announcement
from .weight_subscriber import WeightEngine, WeightSubscriber

__all__ = ["WeightPublisher", "WeightPublishError", "PublishedVersion", "read_latest_announcement",
           "WeightSubscriber", "WeightEngine"]
