"""A folder of images, a subfolder per class, read as Keras's image_dataset_from_directory reads it, and what it refuses."""

import os

import numpy as np
import pytest
from PIL import Image

from tfdist.data.image_folder import MAX_PIXELS, load_image_folder
from tfdist.errors import InputError

from helpers.digits import image_folder


def test_classes_are_the_sorted_subfolders_and_every_image_keeps_its_channels(tmp_path):
    folder = image_folder(tmp_path / "set", {"dog": 3, "cat": 2}, size=(6, 5))
    (folder / "cat" / ".DS_Store").write_bytes(b"hidden")
    images, labels, classes = load_image_folder(folder)
    assert classes == ("cat", "dog") and images.dtype == np.uint8 and images.shape == (5, 6, 5, 3)
    assert labels.tolist() == [0, 0, 1, 1, 1]


def test_images_of_other_sizes_are_resized_when_asked_and_named_when_not(tmp_path):
    folder = image_folder(tmp_path / "set", {"a": 2, "b": 2}, size=(8, 8))
    Image.new("RGB", (5, 7)).save(folder / "b" / "odd.png")
    with pytest.raises(InputError, match="odd.png"):
        load_image_folder(folder)
    images, _, _ = load_image_folder(folder, image_size=(4, 4))
    assert images.shape == (5, 4, 4, 3)


@pytest.mark.parametrize("intruder", ["link out", "pipe", "text", "bomb"])
def test_what_is_not_an_image_of_the_folder_is_refused_by_name(tmp_path, intruder):
    folder = image_folder(tmp_path / "set", {"a": 2, "b": 2}, size=(8, 8))
    bad = folder / "a" / "bad.png"
    if intruder == "link out":
        (tmp_path / "secret.png").write_bytes((folder / "a" / "0.png").read_bytes())
        bad.symlink_to(tmp_path / "secret.png")
        words = "outside"
    elif intruder == "pipe":
        os.mkfifo(bad)
        words = "not a regular file"
    elif intruder == "text":
        bad.write_text("not an image")
        words = "bad.png"
    else:  # a small file that declares more pixels than memory should hold, refused before a pixel is decoded
        Image.new("1", (9000, 9000)).save(bad)
        words = f"more than {MAX_PIXELS:,}"
    with pytest.raises(InputError, match=words):
        load_image_folder(folder)
