import { describe, expect, it } from 'vitest';

import { actionSpec, actionWording, KERNEL_ACTIONS } from '../src/actions';

describe('the kernel actions table', () => {
  it('lists interrupt, restart and shut down with their route', () => {
    expect(KERNEL_ACTIONS.map(a => [a.action, a.verb, a.api])).toEqual([
      ['interrupt', 'Interrupt', 'interrupt'],
      ['restart', 'Restart', 'restart'],
      ['shutdown', 'Shut down', 'shutdown']
    ]);
    expect(actionSpec('shutdown').warning).toContain('GPU memory is released');
  });

  it('words a button, its confirmation and its failure from the same row', () => {
    expect(actionWording('shutdown', 'train.ipynb')).toEqual({
      label: 'Shut down the kernel of train.ipynb',
      title: 'Shut down kernel?',
      body: 'Shut down the kernel of train.ipynb? All variables are lost and its GPU memory is released.',
      failure: 'Could not shut down the kernel of train.ipynb'
    });
    expect(actionWording('interrupt', 'sleep.ipynb').body).toBe(
      'Interrupt the kernel of sleep.ipynb? The running cell stops with KeyboardInterrupt.'
    );
  });
});
