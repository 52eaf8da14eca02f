"""specjax's drafters for SmolLM2-135M-Instruct, as data: pretrained/<name>/ holds each
(HF-format or head directory, with its model card). specjax finds them by this package's
entry point (group `specjax.pretrained`) and loads them by name, e.g.
`specjax.load_drafter("smollm2-eagle3", target)`; nothing here is imported for code."""
