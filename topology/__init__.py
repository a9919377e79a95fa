"""Topology files and what they drive.

:mod:`.schema` (the YAML shape), :mod:`.validation` (cross-checks naming file and key),
:mod:`.plan` (which node runs where, on which cluster, owned by whom), :mod:`.processes`
(a node's components as OS processes: start, supervise, stop), :mod:`.launch`
(``astraflow topology check``, what ``astraflow launch`` adds to the launcher's run,
``astraflow node --topology``), :mod:`.autoscaler` (the autoscaler actor),
:mod:`.scaling` (its rule), :mod:`.backends` (how nodes are started and retired) and
:mod:`.accounting` (device-hours from heartbeats).
"""
