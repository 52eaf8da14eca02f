"""Head files: specjax's own and the layouts others publish, read and written.

native.py     specjax's heads (drafter.json + model.safetensors): `save_drafter`, `load_head`,
              checked against the target they were trained for (`target_fingerprint`)
published.py  the published layouts (EAGLE-1/2, EAGLE-3, Medusa-1/2, speculators), told apart
              by their files and tensor names, read into specjax's head networks
eagle3.py     EAGLE-3's checkpoint details: draft vocabulary maps, feature layers
writers.py    specjax heads written in the published layouts (`save_drafter(format=...)`)
files.py      weight files: safetensors (sharded or not) and torch pickles, found and read
"""
