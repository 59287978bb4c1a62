from {{ cookiecutter.package_name }}.datasets.shapes import CLASSES, draw_shapes_dataset

COUNTS = {"train": 3, "val": 1}


def test_layout_and_counts(tmp_path):
    root = draw_shapes_dataset(tmp_path / "shapes", COUNTS, size=24)
    for split, count in COUNTS.items():
        assert sorted(p.name for p in (root / split).iterdir()) == sorted(CLASSES)
        assert all(len(list((root / split / name).glob("*.png"))) == count for name in CLASSES)
    assert not [p for p in tmp_path.iterdir() if p.name != "shapes"], "the staging folder was left behind"


def test_same_seed_same_images_other_seed_other_images(tmp_path):
    a = draw_shapes_dataset(tmp_path / "a", COUNTS, size=24, seed=1)
    b = draw_shapes_dataset(tmp_path / "b", COUNTS, size=24, seed=1)
    c = draw_shapes_dataset(tmp_path / "c", COUNTS, size=24, seed=2)
    image = "train/star/00002.png"
    assert (a / image).read_bytes() == (b / image).read_bytes()
    assert (a / image).read_bytes() != (c / image).read_bytes()


def test_existing_folder_is_left_alone(tmp_path):
    root = tmp_path / "shapes"
    root.mkdir()
    (root / "mine.txt").write_text("keep")
    draw_shapes_dataset(root, COUNTS, size=24)
    assert [p.name for p in root.iterdir()] == ["mine.txt"]
