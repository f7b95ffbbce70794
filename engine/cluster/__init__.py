"""The model server past one machine: replicas of the same service on Ray Serve, behind one ingress that speaks the
same HTTP API, with routing that keeps a session on its replica and a prompt near its cached prefix. Imported only
by `--replicas` (Ray is an optional extra). See docs/scaling.md."""
