"""The production shape on one machine: docker/compose.yaml's services as processes, each host in
namespaces of its own (docs/deploy.md, "The same topology on one machine"). Not part of the package."""
