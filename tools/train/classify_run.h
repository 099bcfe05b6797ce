#pragma once
// ds_train's run of an encoder classifier (--train_data is a classification set): the console and
// metric files around train::ClassifierTrainer (ds/train/classifier.h), as ds_train.cpp's run() is
// around train::Trainer.
#include "ds/train/options.h"

namespace ds::train {

// Plans, trains (or, with --eval_only, evaluates) and exports; returns the exit status. Throws
// what the trainer throws (ds_train's main reports it).
int run_classifier(const Options& o, const Given& g, const char* builtin_config);

}  // namespace ds::train
