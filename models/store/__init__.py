"""The artifact store: content-addressed blobs and one immutable manifest per model version.

`LocalArtifactStore` keeps everything under `ModelSettings.store_dir`:

    blobs/sha256/<hex>                     every file put, named by its sha256, read-only
    manifests/<name>/<version>.json        the Manifest, listing the sha256 of each file
    packages/<name>/<version>/<relative>   a fetched version's files (hard links to the blobs)

Every fetch hashes every file again, so a corrupted or tampered artifact is refused with
`ArtifactIntegrityError` and never reaches a runtime. Writes go to a temporary name first and
are renamed into place, so readers in other processes never see half a file.
"""

from tidegate.models.store.artifact_store import ArtifactStore
from tidegate.models.store.files import sha256_file
from tidegate.models.store.local import LocalArtifactStore

__all__ = ["ArtifactStore", "LocalArtifactStore", "sha256_file"]
