"""Inference requests of images: a client sends only the frames its server lacks, the server rebuilds every
observation bit for bit from them and the frames it holds, and any disagreement between the two ends in a
request sent whole, never in a wrong observation."""

from __future__ import annotations

import numpy as np
import pytest

from rqrl.errors import RecordError
from rqrl.seed import request_frames
from rqrl.seed.request_frames import HELD_REQUESTS, REBALANCE_REQUESTS, FramesMissing, HeldFrames, SentFrames

DEPTH, SIDE = 4, 12


def env_stacks(envs: int, steps: int, seed: int = 0, depth: int = DEPTH) -> np.ndarray:
    """``[steps, envs, depth, SIDE, SIDE]``: each env's frame stack at each step, shifted by one new random frame."""
    frames = np.random.default_rng(seed).integers(0, 256, (envs, steps + depth - 1, SIDE, SIDE), np.uint8)
    return np.stack([frames[:, t:t + depth] for t in range(steps)])


class Client:
    """A SentFrames that numbers its requests, as InferenceClient does."""

    def __init__(self) -> None:
        self.frames, self.number = SentFrames(), -1

    def request(self, observations: np.ndarray) -> tuple[dict[str, np.ndarray], str | None]:
        self.number += 1
        return self.frames.request(observations, self.number)


def round_trip(client: Client, server: HeldFrames, observations: np.ndarray, name: str = "server-0",
               client_id: str = "client") -> tuple[dict[str, np.ndarray], str | None]:
    """One request answered: what the server rebuilt must be what the client asked about."""
    arrays, to_server = client.request(observations)
    np.testing.assert_array_equal(server.observations(client_id, client.number, arrays), observations)
    client.frames.answered(name, client.number)
    return arrays, to_server


def test_after_the_first_request_each_observation_sends_one_frame() -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=3, steps=6)
    first, to_server = round_trip(client, server, stacks[0])
    assert (len(first["frames"]), to_server) == (3 * DEPTH, None)  # all of them, to any server
    for step in stacks[1:]:
        arrays, to_server = round_trip(client, server, step)
        assert (len(arrays["frames"]), to_server) == (3, "server-0")


def test_a_thread_that_missed_requests_finds_its_frames_in_the_held_ones() -> None:
    """Env 1 asks only every HELD_REQUESTS-th step: its last observation is that many requests back, still held,
    and 2 of its 6 frames are in it."""
    depth = HELD_REQUESTS + 2
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=2 * HELD_REQUESTS + 1, depth=depth)
    round_trip(client, server, stacks[0])
    for t in range(1, len(stacks)):
        asking = [0, 1] if t % HELD_REQUESTS == 0 else [0]
        arrays, _ = round_trip(client, server, stacks[t, asking])
        assert len(arrays["frames"]) == (1 + HELD_REQUESTS if len(asking) == 2 else 1)


def test_a_server_that_lacks_a_frame_says_so_and_holds_nothing_new() -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=3)
    round_trip(client, server, stacks[0])
    arrays, _ = client.request(stacks[1])
    with pytest.raises(FramesMissing):
        HeldFrames().observations("client", 1, arrays)  # another server, or this one restarted
    with pytest.raises(FramesMissing):
        server.observations("another client", 1, arrays)  # frames are held per client
    np.testing.assert_array_equal(server.observations("client", 1, arrays), stacks[1])


def test_after_forget_a_request_goes_whole_to_any_server() -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=2)
    round_trip(client, server, stacks[0])
    client.frames.forget()
    arrays, to_server = client.request(stacks[1])
    assert (len(arrays["frames"]), to_server) == (2 * DEPTH, None)


def test_an_answer_from_another_server_moves_the_client_to_it() -> None:
    client, first_server, second_server = Client(), HeldFrames(), HeldFrames()
    stacks = env_stacks(envs=2, steps=3)
    round_trip(client, first_server, stacks[0], "server-0")
    client.frames.forget()
    round_trip(client, second_server, stacks[1], "server-1")
    arrays, to_server = round_trip(client, second_server, stacks[2], "server-1")
    assert (len(arrays["frames"]), to_server) == (2, "server-1")


def test_every_rebalance_requests_th_request_goes_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request_frames, "REBALANCE_REQUESTS", 3)
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=1, steps=7)
    targets = [round_trip(client, server, step)[1] for step in stacks]
    assert targets == [None, "server-0", None, "server-0", "server-0", None, "server-0"]
    assert REBALANCE_REQUESTS > HELD_REQUESTS


def test_a_request_of_frames_alike_sends_each_once() -> None:
    client, server = Client(), HeldFrames()
    still = np.zeros((5, DEPTH, SIDE, SIDE), np.uint8)  # five envs showing the same blank screen
    arrays, _ = round_trip(client, server, still)
    assert len(arrays["frames"]) == 1 and arrays["frame_index"].shape == (5, DEPTH)


def test_observations_that_are_one_frame_each_travel_too() -> None:
    """A channels-last image is one frame: nothing repeats from step to step, and it still arrives whole."""
    client, server = Client(), HeldFrames()
    images = np.random.default_rng(1).integers(0, 256, (3, 10, 10, 3), np.uint8)
    arrays, to_server = round_trip(client, server, images)
    assert (len(arrays["frames"]), to_server) == (3, None)


def test_a_request_that_reaches_the_server_twice_is_held_once() -> None:
    """Request 1 reaches the server twice (sent again after a timeout, say). The server still holds requests 0 to
    3, as the client counts them, so request 4 rebuilds env A's frames from request 0."""
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=HELD_REQUESTS + 1, depth=HELD_REQUESTS + 2)
    round_trip(client, server, stacks[0, [0]])  # env A
    arrays, _ = client.request(stacks[1, [1]])  # env B from here on
    for _ in range(2):
        np.testing.assert_array_equal(server.observations("client", 1, arrays), stacks[1, [1]])
    client.frames.answered("server-0", 1)
    for step in range(2, HELD_REQUESTS):
        round_trip(client, server, stacks[step, [1]])
    arrays, _ = round_trip(client, server, stacks[HELD_REQUESTS, [0]])  # env A again
    assert 0 in arrays["frame_source"][:, 0].tolist()


@pytest.mark.parametrize("damage", ["no sources", "sources of floats", "sources of one column", "a frame less",
                                    "a position outside", "a request never made"])
def test_a_request_whose_arrays_do_not_fit_is_refused(damage: str) -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=2)
    round_trip(client, server, stacks[0])
    arrays, _ = client.request(stacks[1])
    held = arrays["frame_source"][:, 0] >= 0
    if damage == "no sources":
        del arrays["frame_source"]
    elif damage == "sources of floats":
        arrays["frame_source"] = arrays["frame_source"].astype(np.float32)
    elif damage == "sources of one column":
        arrays["frame_source"] = arrays["frame_source"][:, :1]
    elif damage == "a frame less":
        arrays["frames"] = arrays["frames"][1:]
    elif damage == "a position outside":
        arrays["frame_source"][held, 1] = 2 * DEPTH
    else:
        arrays["frame_source"][held, 0] = 7
    with pytest.raises(FramesMissing if damage == "a request never made" else RecordError):
        server.observations("client", 1, arrays)


def test_held_frames_of_another_shape_are_refused() -> None:
    client, server = Client(), HeldFrames()
    round_trip(client, server, env_stacks(envs=1, steps=1)[0])
    arrays, _ = client.request(env_stacks(envs=1, steps=2)[1])
    arrays["frames"] = np.zeros((len(arrays["frames"]), SIDE, SIDE + 1), np.uint8)
    with pytest.raises(RecordError, match="frames are"):
        server.observations("client", 1, arrays)


def test_a_client_not_heard_from_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(request_frames.time, "monotonic", lambda: now[0])
    client, server = Client(), HeldFrames(idle_seconds=60.0)
    stacks = env_stacks(envs=1, steps=2)
    round_trip(client, server, stacks[0])
    now[0] += 61.0
    round_trip(Client(), server, stacks[0], client_id="another")  # wakes the sweep
    assert server.clients == 1
    with pytest.raises(FramesMissing):
        server.observations("client", 1, client.request(stacks[1])[0])


def test_frames_of_a_request_the_server_dropped_are_sent_again() -> None:
    """Env 1 asks every HELD_REQUESTS + 1 steps: its last request has left the server's (and the client's) held
    ones by then, so its frames go again rather than as a source the server no longer holds."""
    depth = HELD_REQUESTS + 3
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=2 * HELD_REQUESTS + 3, depth=depth)
    round_trip(client, server, stacks[0])
    for t in range(1, len(stacks)):
        asking = [0, 1] if t % (HELD_REQUESTS + 1) == 0 else [0]
        arrays, _ = round_trip(client, server, stacks[t, asking])
        assert len(arrays["frames"]) == (1 + depth if len(asking) == 2 else 1)


def test_an_answer_to_an_earlier_request_than_the_last_made_is_not_counted() -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=1, steps=3)
    client.request(stacks[0])
    client.request(stacks[1])
    client.frames.answered("server-0", 0)  # request 0's frames are not what the client last listed
    arrays, to_server = round_trip(client, server, stacks[2])
    assert (len(arrays["frames"]), to_server) == (DEPTH, None)


@pytest.mark.parametrize("hostile", ["more distinct frames than the index holds", "a huge frame shape",
                                     "an index of depth 0", "frames of floats"])
def test_a_signed_request_that_would_blow_memory_or_make_nothing_is_refused(hostile: str) -> None:
    arrays, _ = Client().request(env_stacks(envs=1, steps=1)[0])
    if hostile == "more distinct frames than the index holds":
        arrays["frame_source"] = np.full((10**6, 2), -1, np.int32)
        arrays["frames"] = np.zeros((10**6, 1, 1), np.uint8)
    elif hostile == "a huge frame shape":
        arrays["frames"] = np.zeros((0, 10**6, 10**6), np.uint8)
        arrays["frame_source"] = np.zeros((4, 2), np.int32)
    elif hostile == "an index of depth 0":
        arrays["frame_index"] = np.zeros((10**9, 0), np.int32)
    else:
        arrays["frames"] = arrays["frames"].astype(np.float64)
    with pytest.raises(RecordError):
        HeldFrames().observations("client", 0, arrays)


def test_a_request_whose_index_does_not_fit_leaves_nothing_held() -> None:
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=1, steps=2)
    arrays, _ = client.request(stacks[0])
    arrays["frame_index"] = arrays["frame_index"] + 100
    with pytest.raises(RecordError):
        server.observations("client", 0, arrays)
    assert server.clients == 0


def test_a_late_copy_of_an_earlier_request_keeps_the_order_the_client_counts_on() -> None:
    """Envs A, B, C, D ask in turn (requests 0-3), a copy of request 1 arrives late, then A, B and C ask again.
    Held in its place, request 1's copy leaves the server holding requests 2-5 when C's request 6 relies on
    request 2, as the client counts them; held as the newest, it would have pushed request 2 out first."""
    assert HELD_REQUESTS == 4
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=4, steps=7, depth=HELD_REQUESTS + 2)
    copies = [round_trip(client, server, stacks[step, [step]])[0] for step in range(4)]
    server.observations("client", 1, copies[1])  # the late copy
    for step, env in ((4, 0), (5, 1)):
        round_trip(client, server, stacks[step, [env]])
    arrays, _ = round_trip(client, server, stacks[6, [2]])  # raises FramesMissing if request 2 was dropped
    assert 2 in arrays["frame_source"][:, 0].tolist()


@pytest.mark.parametrize("compact_slots", [request_frames.COMPACT_SLOTS, 4], ids=["pool as it grows", "compacted"])
@pytest.mark.parametrize("seed", range(12))
def test_whatever_is_lost_delayed_or_restarted_no_observation_is_rebuilt_wrong(
        seed: int, compact_slots: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two servers that restart now and then, copies of requests that arrive late, answers that are lost, envs
    that ask at random and frames that repeat across envs: every rebuild the servers make is the observations
    asked about, and most requests still rely on held frames (also with pools compacted whenever they can be)."""
    import random

    monkeypatch.setattr(request_frames, "COMPACT_SLOTS", compact_slots)

    draw, numbers = random.Random(seed), np.random.default_rng(seed)
    envs, steps = 4, 150
    palette = numbers.integers(0, 256, (6, SIDE, SIDE), np.uint8)
    frames = palette[numbers.integers(0, 6, (envs, steps + DEPTH))]
    position = [0] * envs
    servers = {"A": HeldFrames(), "B": HeldFrames()}
    client, late, rebuilt, relied = SentFrames(), [], 0, 0

    def rebuild(name: str, number: int, arrays: dict, observations: np.ndarray) -> bool:
        nonlocal rebuilt
        try:
            np.testing.assert_array_equal(servers[name].observations("c", number, arrays), observations)
        except FramesMissing:
            return False
        rebuilt += 1
        return True

    for number in range(steps):
        asking = [env for env in range(envs) if draw.random() < 0.7] or [0]
        for env in asking:
            position[env] += 1
        observations = np.stack([frames[env, position[env]:position[env] + DEPTH] for env in asking])
        while True:
            arrays, to_server = client.request(observations, number)
            relied += to_server is not None
            name = to_server or draw.choice("AB")
            if draw.random() < 0.05:
                servers[name] = HeldFrames()  # restarted
            arriving = [draw.random() < 0.3 for _ in late]
            for copy in [copy for copy, now in zip(late, arriving, strict=True) if now]:
                rebuild(*copy)
            late = [copy for copy, now in zip(late, arriving, strict=True) if not now]
            if draw.random() < 0.1:  # it waits in Redis: the client times out
                late.append((name, number, arrays, observations))
                client.forget()
                continue
            if not rebuild(name, number, arrays, observations) or draw.random() < 0.05:  # missing, or answer lost
                client.forget()
                continue
            client.answered(name, number)
            break
    assert rebuilt >= steps and relied > steps // 3


def test_a_clients_pool_reuses_the_slots_of_frames_no_held_request_lists() -> None:
    """Each frame is written into the client's pool once; the pool stops growing (once a whole request, every
    REBALANCE_REQUESTS, has come on top of the held frames): the slots of frames that left the held requests take
    the new ones."""
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=3, steps=300)
    sizes = []
    for step in stacks:
        round_trip(client, server, step)
        sizes.append(server.pool_bytes)
    frame_bytes = SIDE * SIDE
    assert sizes[REBALANCE_REQUESTS] == sizes[-1] <= 2 * (HELD_REQUESTS + 1) * 3 * DEPTH * frame_bytes


def test_a_whole_request_of_frames_of_another_shape_starts_its_client_over() -> None:
    client, server = Client(), HeldFrames()
    round_trip(client, server, env_stacks(envs=2, steps=1)[0])
    client.frames.forget()
    wider = np.random.default_rng(3).integers(0, 256, (2, DEPTH, SIDE, SIDE + 2), np.uint8)
    round_trip(client, server, wider)
    assert server.pool_bytes % (SIDE * (SIDE + 2)) == 0  # the narrower frames' pool is gone, not kept beside
    stacks = np.concatenate([wider[:, 1:], np.zeros((2, 1, SIDE, SIDE + 2), np.uint8)], axis=1)
    arrays, to_server = round_trip(client, server, stacks)  # relies on the wider frames, held now
    assert (len(arrays["frames"]), to_server) == (1, "server-0")


def test_rebuilt_observations_are_gathered_into_an_array_of_any_dtype() -> None:
    """A server's batch of wider observations (float32, say, from requests of another kind in it) takes them too."""
    stacks = env_stacks(envs=2, steps=1)[0]
    rebuilt = HeldFrames().rebuild("client", 0, Client().request(stacks)[0])
    assert (rebuilt.shape, rebuilt.dtype, len(rebuilt)) == (stacks.shape, np.uint8, 2)
    into = np.empty(stacks.shape, np.float32)
    rebuilt.write(into)
    np.testing.assert_array_equal(into, stacks)
    one_frame = np.random.default_rng(4).integers(0, 256, (2, SIDE, SIDE, 3), np.uint8)  # channels-last images
    rebuilt = HeldFrames().rebuild("client", 0, Client().request(one_frame)[0])
    into = np.empty(one_frame.shape, np.uint8)
    rebuilt.write(into)
    np.testing.assert_array_equal(into, one_frame)


@pytest.mark.parametrize("number", [-1, -7, 2**62, 2**64])
def test_a_request_numbered_outside_what_clients_count_is_refused_and_changes_nothing(number: int) -> None:
    """-1 marks the held requests' free rows, and numbers past int64 do not fit them: a signed request with such a
    number must neither corrupt the frames held for the client nor stop the server."""
    client, server = Client(), HeldFrames()
    stacks = env_stacks(envs=2, steps=3)
    round_trip(client, server, stacks[0])
    with pytest.raises(RecordError, match=f"a request numbered {number}"):
        server.rebuild("client", number, Client().request(stacks[0])[0])
    round_trip(client, server, stacks[1])
    arrays, to_server = round_trip(client, server, stacks[2])
    assert (len(arrays["frames"]), to_server) == (2, "server-0")


def test_a_clients_pool_shrinks_back_after_a_request_far_bigger_than_its_others() -> None:
    client, server = Client(), HeldFrames()
    big = np.random.default_rng(5).integers(0, 256, (600, DEPTH, SIDE, SIDE), np.uint8)  # 2,400 distinct frames
    round_trip(client, server, big)
    peak = server.pool_bytes
    stacks = env_stacks(envs=2, steps=HELD_REQUESTS + 2, seed=6)
    client.frames.forget()
    for step in stacks:
        round_trip(client, server, step)
    assert server.pool_bytes <= peak // 10, (server.pool_bytes, peak)
