// NoteGate: a notification is dropped when a batch it waited on fails, and only then.
#include "transport/note_gate.h"

#include <gtest/gtest.h>

namespace kv::transport {
namespace {

TEST(NoteGate, ANoteFollowsTheBatchesThatLanded) {
  NoteGate gate;
  const uint64_t a = gate.BatchPosted(1), b = gate.BatchPosted(1);
  const NoteGate::Ticket note = gate.NotePosted(1);
  gate.BatchDone(1, b, true);
  gate.BatchDone(1, a, true);
  EXPECT_TRUE(gate.MayDeliver(1, note));
}

// cuda_ipc holds a batch until its engine's event fired, so a note can reach the progress thread
// before batches posted ahead of it: it asks the gate whether they all finished.
TEST(NoteGate, ANoteIsFinishedOnlyOnceEveryBatchBeforeItIs) {
  NoteGate gate;
  const uint64_t a = gate.BatchPosted(1), b = gate.BatchPosted(1);
  const NoteGate::Ticket note = gate.NotePosted(1);
  const uint64_t later = gate.BatchPosted(1);  // after the note: not waited on
  EXPECT_FALSE(gate.Finished(1, note));
  gate.BatchDone(1, b, true);
  EXPECT_FALSE(gate.Finished(1, note));
  gate.BatchDone(1, a, false);
  EXPECT_TRUE(gate.Finished(1, note));
  EXPECT_FALSE(gate.MayDeliver(1, note));  // finished, but one of them failed
  EXPECT_TRUE(gate.Finished(2, gate.NotePosted(2)));
  EXPECT_FALSE(gate.Finished(1, gate.NotePosted(1)));  // `later` is still moving
  gate.BatchDone(1, later, true);
  EXPECT_TRUE(gate.Finished(1, gate.NotePosted(1)));
}

TEST(NoteGate, ANoteBehindAFailedBatchIsDropped) {
  NoteGate gate;
  const uint64_t a = gate.BatchPosted(1), b = gate.BatchPosted(1);
  const NoteGate::Ticket first = gate.NotePosted(1);
  const NoteGate::Ticket second = gate.NotePosted(1);  // no batch between the two notes
  gate.BatchDone(1, a, true);
  gate.BatchDone(1, b, false);
  EXPECT_FALSE(gate.MayDeliver(1, first));
  EXPECT_FALSE(gate.MayDeliver(1, second));
  // A batch posted after the notes, and the notes after it, are not held to the failure.
  const uint64_t c = gate.BatchPosted(1);
  const NoteGate::Ticket third = gate.NotePosted(1);
  gate.BatchDone(1, c, true);
  EXPECT_TRUE(gate.MayDeliver(1, third));
}

TEST(NoteGate, AFailureAfterTheNoteWasPostedOnlyDropsLaterNotes) {
  NoteGate gate;
  const uint64_t a = gate.BatchPosted(1);
  gate.BatchDone(1, a, true);
  const NoteGate::Ticket before = gate.NotePosted(1);  // waits on nothing unfinished
  const uint64_t b = gate.BatchPosted(1);
  const NoteGate::Ticket after = gate.NotePosted(1);
  gate.BatchDone(1, b, false);
  EXPECT_TRUE(gate.MayDeliver(1, before));
  EXPECT_FALSE(gate.MayDeliver(1, after));
}

TEST(NoteGate, ANoteWaitsOnEveryBatchStillMovingWhenItWasPosted) {
  NoteGate gate;
  const uint64_t slow = gate.BatchPosted(1);
  const uint64_t quick = gate.BatchPosted(1);
  gate.BatchDone(1, quick, true);
  const NoteGate::Ticket note = gate.NotePosted(1);  // `slow` is still moving
  gate.BatchDone(1, slow, false);
  EXPECT_FALSE(gate.MayDeliver(1, note));
}

TEST(NoteGate, PeersAreIndependentAndAForgottenPeerStartsClean) {
  NoteGate gate;
  const uint64_t to1 = gate.BatchPosted(1), to2 = gate.BatchPosted(2);
  const NoteGate::Ticket note1 = gate.NotePosted(1), note2 = gate.NotePosted(2);
  gate.BatchDone(1, to1, false);
  gate.BatchDone(2, to2, true);
  EXPECT_FALSE(gate.MayDeliver(1, note1));
  EXPECT_TRUE(gate.MayDeliver(2, note2));
  gate.ForgetPeer(1);
  gate.BatchDone(1, to1, false);  // late news of a forgotten peer changes nothing
  const uint64_t again = gate.BatchPosted(1);
  const NoteGate::Ticket fresh = gate.NotePosted(1);
  gate.BatchDone(1, again, true);
  EXPECT_TRUE(gate.MayDeliver(1, fresh));
}

}  // namespace
}  // namespace kv::transport
