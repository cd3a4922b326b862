#!/bin/sh
# Makes tidegate/<folder> a link to ../<folder> for each card folder, as git does in a checkout
# with symlinks. For a checkout without them (a ZIP download, core.symlinks=false), where the build
# otherwise stops (setup.py, docs/decisions/007). Idempotent.
set -eu
cd "$(dirname "$0")/../tidegate"
for folder in agents cli clients core dlq examples gateway lifecycle models schemas; do
  if [ ! -L "$folder" ]; then
    rm -f "$folder"
    ln -s "../$folder" "$folder"
  fi
done
echo "tidegate/: links to the top-level folders in place"
