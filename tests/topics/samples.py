"""One filled-in instance of every message type, for round-trip tests."""

from astraflow.topics import messages as m

MANIFEST = m.ChunkManifest("obj1", "af.x.weights.policy", 10, "ab" * 32,
                           [m.ChunkRef(0, 5, 10, "cd" * 32)])
GROUP = m.TrajectoryGroup(
    task_id="task-1", prompt_id="p-1", policy="policy", node_id="raas-0", prompt_ids=[5, 6, 7],
    samples=[m.Sample([1, 2, 3], [-0.1, -0.2, -0.3], [4, 4, 5], 1.0, "stop", "12"),
             m.Sample([9], [-2.5], [4], 0.0, "length", "x")],
    scheduled_version=4, started_at=1.5, finished_at=2.5)

SAMPLES: dict[str, m.Message] = {
    "prompt": m.Prompt("p-1", "3+4=", "7", "synthetic", {"difficulty": 2}),
    "task": m.Task("task-1", "p-1", "policy", "3+4=", "7", 4, {"temperature": 1.0},
                   scheduled_version=3, created_at=1.0),
    "trajectory-group": GROUP,
    "batch": m.Batch("policy", 7, [GROUP], [m.SourceOffset("af.x.trajectories", 1, 42)], {"reward": 0.5}),
    "group-drop": m.GroupDrop("policy", "task-1", m.SourceOffset("af.x.trajectories", 1, 43), "stale", 7,
                              "a token of version 4", 13.0),
    "dataflow-state": m.DataflowState("policy", 8, 40, 3, ["task-2"], [m.SourceOffset("af.x.trajectories", 1, 44)],
                                      14.0),
    "version": m.VersionAnnouncement("policy", 3, "delta", 2, 0, MANIFEST, "ff" * 32,
                                     snapshot_manifest=MANIFEST, deltas=[MANIFEST], delta_versions=[3],
                                     created_at=9.0),
    "heartbeat": m.Heartbeat("raas-0", "raas", "policy", 3, tokens_per_s=123.4, ts=10.0),
    "snapshot-request": m.SnapshotRequest("policy", "raas-0", 3, "chunk 1 corrupt", 12.5),
    "metric": m.Metric("trainer", "loss", 0.25, 3, 11.0, {"policy": "policy"}),
    "generation-request": m.GenerationRequest("n0.1", "task-1", "verifier", "verifier", [[5, 6]], [11],
                                              {"temperature": 1.0}, ts=15.0, reply_partition=1),
    "generation-reply": m.GenerationReply("n0.1", "task-1", "raas-verifier-0", [[7, 1]], [[-0.3, -0.1]], [2],
                                          ["stop"], "", 16.0),
    "dead-letter": m.DeadLetter("af.x.tasks.policy", 2, 17, "DecodeError", "bad", "a2V5", "dmFs",
                                {"af-type": "task"}, "raas-0", 12.0),
}
