"""The embedded demo model's world: flat scenes of one coloured shape on a coloured background.

`scenes` draws them (training data, and the ground truth the classifier is checked against),
`captions` phrases them (training phrasings apart from held-out ones), `classify` reads a
generated image back with a fixed pixel rule, `prompt_set` builds the bundled prompts. The
weights trained on this world (tools/train_demo.py) ship in jobs/data/demo/.
"""
