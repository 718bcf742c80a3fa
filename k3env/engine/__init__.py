"""What talks to dockerd and to registries: the Engine protocol, k3env's own Docker Engine API
client, the registry API."""
