#!/bin/sh
# Puts infra/migrations where an installed tidegate looks for them (run by the Dockerfile, from the
# checkout's root, after `pip install .`).
#
# tidegate.core.db.MIGRATIONS_DIR is derived from the module's own path: in a checkout or an editable
# install it is the checkout's infra/migrations, but after a non-editable install it points inside
# site-packages (tidegate/infra/migrations), which the wheel does not contain. So `tidegate controller
# --migrate` would find no migrations in the image. This copies them there and checks that the
# installed package (imported from /, never from the checkout) now reads every one of them.
set -eu
src=$(pwd)/infra/migrations
dest=$(cd / && python -c 'from tidegate.core.db import MIGRATIONS_DIR; print(MIGRATIONS_DIR)')
mkdir -p "$dest"
# An editable install already reads the checkout's own folder.
[ "$(cd "$dest" && pwd -P)" = "$(cd "$src" && pwd -P)" ] || cp "$src"/*.sql "$dest"/
cd / && python - "$src" <<'PY'
import sys
from pathlib import Path

from tidegate.core.db import MIGRATIONS_DIR

wanted = sorted(p.name for p in Path(sys.argv[1]).glob("*.sql"))
found = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
if not wanted or found != wanted:
    sys.exit(f"image-migrations: {MIGRATIONS_DIR} holds {found}, expected {wanted}")
print(f"image-migrations: {len(found)} files in {MIGRATIONS_DIR}")
PY
