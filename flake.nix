{
  # Host tools for k3env, pinned to one nixpkgs revision (nixos-24.11; flake.lock has its
  # narHash). On a Nix host:  nix develop -c nox -s build-image
  description = "k3env: pinned, patched, verified serving images (vLLM, Dynamo) for Slurm";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/50ab793786d9de88ee30ec4e4c24fb4236fc2674";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python311.withPackages (ps: [
              ps.nox
              ps.pip
              ps.tomlkit
              ps.packaging
              ps.pyyaml
              ps.pytest
            ]))
            pkgs.docker-client
            pkgs.skopeo
            pkgs.squashfsTools
            pkgs.libfaketime
            pkgs.debootstrap
            pkgs.git
            # arm64 (Grace) twins and images run under qemu-user (binfmt_misc is the host's).
            pkgs.qemu
            # `k3env twin --resolve` resolves the twin's requirements with uv.
            pkgs.uv
            # The local Slurm of tests/engine/test_slurm_engine.py (slurmctld, slurmd, munged).
            pkgs.slurm
            pkgs.munge
          ];
          shellHook = ''
            export PIP_DISABLE_PIP_VERSION_CHECK=1
          '';
        };
      });
    };
}
