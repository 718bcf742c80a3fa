"""Getting images to the cluster: push by digest, enroot squashfs export and check, the SBOM
and signed provenance, the staged cache and pyxis's importer."""
