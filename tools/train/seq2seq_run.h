#pragma once
// ds_train's run of an encoder-decoder (--train_data is a seq2seq set): the console and metric
// files around train::Seq2SeqTrainer (ds/train/seq2seq_trainer.h), as classify_run.h is around
// train::ClassifierTrainer.
#include "ds/train/options.h"

namespace ds::train {

// Plans, trains (or, with --eval_only, evaluates) and exports; returns the exit status. Throws
// what the trainer throws (ds_train's main reports it).
int run_seq2seq(const Options& o, const Given& g, const char* builtin_config);

}  // namespace ds::train
