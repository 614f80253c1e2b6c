# Sourced by the GPU scripts that run the optimizer on the bare image (no Ray, no head): farm.core needs pydantic,
# which the image lacks. Its cp312 wheels are carried as .whl/pyd (`pip download --only-binary=:all:
# --python-version 3.12 --platform manylinux2014_x86_64 --no-deps -d .whl/pyd pydantic pydantic-core
# typing-inspection annotated-types typing-extensions`) and installed into /tmp/site.
export PYTHONPATH=$PWD:$PWD/agents:/tmp/site
python3 -c "import pydantic" 2>/dev/null || pip install -q --no-index --no-deps --target /tmp/site .whl/pyd/*.whl \
  || { echo "pydantic: install failed"; exit 3; }
